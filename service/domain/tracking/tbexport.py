"""The TensorBoard side of the exporter: each job's event file, appended from its stored records.

A writer holds the job's open event file, its cursor (the last ``seq`` written) and its mean
fold, in this process only: the files are a cache of the store, so a supervisor that starts on a
job without a writer (after a restart or a failover, or after a failed write) rewrites them from
the first record (``service.domain.tracking.tensorboard``). Once the job is over and every record
is written, the means of incomplete epochs are added, the file is closed and the row says so.
"""

import logging
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy.orm import Session, sessionmaker

from service.domain.lease import Lease
from service.domain.tracking.points import MeanFold, rank_point
from service.domain.tracking.runexport import BATCH_RECORDS, Deposed
from service.domain.tracking.tensorboard import EventFile
from service.store import tracking as store
from service.store.tables import TrackingExport
from torchyard_contract.attempts import spec_world_size
from torchyard_contract.rundir import RunDir
from torchyard_contract.state import TERMINAL_STATES, JobState

logger = logging.getLogger(__name__)


@dataclass
class _Writer:
    file: EventFile
    fold: MeanFold
    seq: int = 0


@dataclass
class TensorBoardExporter:
    runs_dir: Path  # the run directories (``settings.runs_dir``)
    sessions: sessionmaker[Session]
    read_sessions: sessionmaker[Session]
    lease: Lease
    _writers: dict[int, _Writer] = field(default_factory=dict)

    def written_through(self, export_id: int) -> int | None:
        """The last seq written for this row in this process; None without a writer."""
        writer = self._writers.get(export_id)
        return writer.seq if writer is not None else None

    def held(self) -> set[int]:
        """The rows this process has a writer for."""
        return set(self._writers)

    def forget(self, export_id: int | None = None) -> None:
        """Close one row's writer (or all): the next step rewrites its files from the start."""
        ids = list(self._writers) if export_id is None else [export_id]
        for key in ids:
            writer = self._writers.pop(key, None)
            if writer is not None:
                try:
                    writer.file.close()
                except OSError:
                    pass

    def step(self, row: TrackingExport) -> bool:
        """Append the job's next records (a batch); close the file once the job is over and
        everything is in. True if it wrote something."""
        with self.read_sessions() as session:
            job = store.job(session, row.job_id or 0)
            if job is None:
                self.forget(row.id)
                return False
            state, spec = job.state, job.spec
            writer = self._writers.get(row.id)
            after = writer.seq if writer is not None else 0
            rows = store.records_between(session, job.id, after, None, BATCH_RECORDS)
            last = store.last_seq(session, job.id)
        if writer is None:
            run = RunDir.for_job(self.runs_dir, job.id)
            writer = _Writer(EventFile(run), MeanFold(spec_world_size(spec)))
            self._writers[row.id] = writer
        try:
            if rows:
                writer.file.write([rank_point(r) for r in rows] + writer.fold.fold(rows))
                writer.seq = rows[-1].seq
            if JobState(state) not in TERMINAL_STATES or writer.seq < last:
                return bool(rows)
            writer.file.write(writer.fold.final())
        except OSError:
            self.forget(row.id)  # the next step starts the files again
            raise
        self.forget(row.id)
        with self.sessions() as session:
            if not self.lease.fence(session):
                raise Deposed()
            store.update_export(session, row.id, tensorboard_done=True)
            session.commit()
        logger.info("job %s: TensorBoard files written", job.id)
        return True
