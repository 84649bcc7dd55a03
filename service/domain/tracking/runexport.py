"""One job's (or sweep's) MLflow run, advanced one bounded step at a time by the exporter.

The delivery protocol (docs/tracking.md, "Exactly once"): records go out in ``seq`` order, a
batch at a time. Before a batch is sent its last ``seq`` is stored as ``sent_seq``; once MLflow
acknowledged every call of it, ``acked_seq`` moves up to it. A step that finds ``sent_seq``
above ``acked_seq`` — the last batch's outcome is unknown: the server died while sending, or
MLflow did not answer — computes that batch again (the points are a function of the stored
records in ``seq`` order: ``service.domain.tracking.points``), reads back the run's history of
each of its series (``metrics/get-history``) and sends only the points not there yet. MLflow's
``log-batch`` is not idempotent; this makes each point land once.

Every write to the outbox is fenced by the supervisor lease: a process that lost it writes
nothing, and the next holder goes on from what was stored.
"""

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from service.domain.files.artifactlisting import output_files
from service.domain.files.artifacts import ArtifactNotFound, open_output
from service.domain.lease import Lease
from service.domain.tracking import naming
from service.domain.tracking.mlflowclient import MlflowClient, point_key
from service.domain.tracking.points import MeanFold, Point, rank_point, timestamp_ms
from service.settings import Settings
from service.store import tracking as store
from service.store.tables import Job, Sweep, TrackingExport
from torchyard_contract.attempts import spec_world_size
from torchyard_contract.rundir import RunDir
from torchyard_contract.spec import JobSpec
from torchyard_contract.state import TERMINAL_STATES, JobState

logger = logging.getLogger(__name__)

# Records per batch: their rank points and the means they complete stay a few log-batch calls.
BATCH_RECORDS = 800
CHUNK_BYTES = 1024 * 1024
SKIPPED_LIST_MAX = 20  # file names quoted in the tag that says what was not uploaded


class Deposed(Exception):  # noqa: N818 — a state, not a failure
    """This process lost the supervisor lease: it writes nothing more."""


@dataclass
class RunExporter:
    """The MLflow side of the exporter: what one step of one outbox row does."""

    settings: Settings
    client: MlflowClient
    sessions: sessionmaker[Session]
    read_sessions: sessionmaker[Session]
    lease: Lease
    # The best trial of an ended sweep (its job id), decided by the sweeps' own rule.
    best_trial: Callable[[Session, Sweep], int | None]
    # Each row's mean fold at its ``acked_seq`` (export id → (acked_seq, fold)); a fold that
    # might be ahead of what MLflow acknowledged is dropped and folded again from the store.
    _folds: dict[int, tuple[int, MeanFold]] = field(default_factory=dict)

    def forget(self, export_id: int | None = None) -> None:
        if export_id is None:
            self._folds.clear()
        else:
            self._folds.pop(export_id, None)

    def _write(self, export_id: int, **values: Any) -> None:
        with self.sessions() as session:
            if not self.lease.fence(session):
                raise Deposed()
            store.update_export(session, export_id, **values)
            session.commit()

    # --- jobs -----------------------------------------------------------------------------
    def step_job(self, row: TrackingExport) -> bool:
        """One step of a job's run: create it, send the next batch (or re-send the unknown
        one), follow the job's status, or close the run once the job is over and everything
        is in. True if it did something (the exporter comes back soon)."""
        if row.mlflow_done:
            return False
        with self.read_sessions() as session:
            job = store.job(session, row.job_id or 0)
            if job is None:
                return False  # deleted: its row goes with it
            last = store.last_seq(session, job.id)
            parent = self._parent_run(session, job)
        if row.run_id is None:
            if parent is False:
                return False  # the sweep's run is not made yet
            self._create_job_run(row, job, parent or None)
            return True
        if row.sent_seq > row.acked_seq:
            self._resend(row, job)
            return True
        if last > row.acked_seq:
            self._send_next(row, job)
            return True
        status = naming.job_status(job.state, job.running_at is not None)
        if JobState(job.state) not in TERMINAL_STATES:
            if status != row.status:
                self.client.set_status(row.run_id, status)
                self._write(row.id, status=status, error=None, failures=0)
                return True
            return False
        self._close_job_run(row, job, status)
        return True

    def _parent_run(self, session: Session, job: Job) -> str | bool | None:
        """A trial's parent run id; False while the sweep's run is still to be made; None for
        a job of no sweep (or of a sweep not exported)."""
        if job.sweep_id is None:
            return None
        parent = store.export_of_sweep(session, job.sweep_id)
        if parent is None or not parent.mlflow:
            return None
        return parent.run_id or False

    def _create_job_run(self, row: TrackingExport, job: Job, parent: str | None) -> None:
        spec = JobSpec.model_validate(job.spec)
        experiment_id = self.client.experiment_id(row.experiment or naming.DEFAULT_EXPERIMENT)
        run = self.client.run_by_tag(experiment_id, "torchyard.export_key", row.export_key)
        if run is None:  # (found: created by a step whose answer was lost)
            tags = naming.job_tags(job, spec, self.settings.public_url, row.export_key, parent)
            run = self.client.create_run(experiment_id, job.name,
                                         timestamp_ms(_utc_seconds(job.created_at)), tags)
        self.client.log_batch(run.run_id, params=naming.job_params(job, spec))
        self._write(row.id, run_id=run.run_id, experiment_id=experiment_id,
                    artifact_uri=run.artifact_uri, status=naming.RUNNING, error=None, failures=0)
        logger.info("job %s: MLflow run %s in experiment %r", job.id, run.run_id, row.experiment)

    def _fold(self, row: TrackingExport, job: Job) -> MeanFold:
        """The row's mean fold at ``acked_seq``, folded again from the store when not held."""
        held = self._folds.get(row.id)
        if held is not None and held[0] == row.acked_seq:
            return held[1]
        fold = MeanFold(spec_world_size(job.spec))
        with self.read_sessions() as session:
            fold.fold(store.epoch_records_through(session, job.id, row.acked_seq))
        self._folds[row.id] = (row.acked_seq, fold)
        return fold

    def _points(self, row: TrackingExport, job: Job, through: int | None
                ) -> tuple[int, list[Point], MeanFold]:
        """The next batch after ``acked_seq`` (up to ``through`` when given): its last seq, its
        points (rank points, then the means it completes) and the fold, left at that seq."""
        fold = self._fold(row, job)
        self._folds.pop(row.id, None)  # ahead of acked_seq from here until acknowledged
        with self.read_sessions() as session:
            rows = store.records_between(session, job.id, row.acked_seq, through,
                                         BATCH_RECORDS if through is None else 10**9)
        points = [rank_point(r) for r in rows] + fold.fold(rows)
        last = rows[-1].seq if rows else (through or row.acked_seq)
        return last, points, fold

    def _send_next(self, row: TrackingExport, job: Job) -> None:
        last, points, fold = self._points(row, job, None)
        self._write(row.id, sent_seq=last)
        self.client.log_batch(row.run_id or "", points)
        self._acknowledged(row, job, last, fold)

    def _resend(self, row: TrackingExport, job: Job) -> None:
        last, points, fold = self._points(row, job, row.sent_seq)
        missing = self._not_in_history(row.run_id or "", points)
        logger.info("job %s: re-sending records %s–%s after an unknown outcome: %d of %d "
                    "points were not in MLflow", job.id, row.acked_seq + 1, row.sent_seq,
                    len(missing), len(points))
        self.client.log_batch(row.run_id or "", missing)
        self._acknowledged(row, job, row.sent_seq, fold)

    def _acknowledged(self, row: TrackingExport, job: Job, last: int, fold: MeanFold) -> None:
        self._write(row.id, acked_seq=last, sent_seq=last, error=None, failures=0)
        self._folds[row.id] = (last, fold)

    def _not_in_history(self, run_id: str, points: list[Point]) -> list[Point]:
        """``points`` less those MLflow's history of their series holds (as many times)."""
        there: Counter = Counter()
        for key in sorted({p.key for p in points}):
            there.update(self.client.history(run_id, key))
        missing = []
        for p in points:
            k = point_key(p.key, p.step, p.timestamp_ms, p.value)
            if there[k] > 0:
                there[k] -= 1
            else:
                missing.append(p)
        return missing

    def _close_job_run(self, row: TrackingExport, job: Job, status: str) -> None:
        """The job is over and every record is in: the means of epochs left incomplete, the
        outputs (``log_outputs``), the final tags and status. Each part may be done again
        (read back, overwritten, idempotent), so a close cut short is simply run again."""
        run_id = row.run_id or ""
        fold = self._fold(row, job)
        final = fold.final()
        self._folds.pop(row.id, None)
        if final:
            self.client.log_batch(run_id, self._not_in_history(run_id, final))
        tags = {"torchyard.state": job.state}
        if job.reason and job.state != JobState.succeeded.value:
            tags["torchyard.reason"] = job.reason[: naming.TAG_VALUE_MAX]
        if job.exit_code is not None:
            tags["torchyard.exit_code"] = str(job.exit_code)
        if row.log_outputs:
            tags.update(self._upload_outputs(row, job))
        self.client.log_batch(run_id, tags=tags)
        ended = _utc_seconds(job.ended_at) if job.ended_at else time.time()
        self.client.set_status(run_id, status, timestamp_ms(ended))
        self._write(row.id, status=status, mlflow_done=True, error=None, failures=0)
        logger.info("job %s: MLflow run %s exported (%s)", job.id, run_id, status)

    def _upload_outputs(self, row: TrackingExport, job: Job) -> dict[str, str]:
        """Upload the output directory's files in path order while they fit
        ``TORCHYARD_MLFLOW_MAX_ARTIFACT_BYTES``; the tags that say what was skipped."""
        run = RunDir.for_job(self.settings.runs_dir, job.id)
        budget = self.settings.mlflow_max_artifact_bytes
        sent, skipped = 0, []
        for item in output_files(run):
            if sent + item.size > budget:
                skipped.append(item)
                continue
            try:
                fd, st = open_output(run, item.path)
            except ArtifactNotFound:
                continue  # gone, or replaced by something that is not a file
            with open(fd, "rb", closefd=True) as file:
                self.client.upload(row.artifact_uri or "", item.path,
                                   _chunks(file, st.st_size), st.st_size)
            sent += st.st_size
        if not skipped:
            return {}
        names = ", ".join(a.path for a in skipped[:SKIPPED_LIST_MAX])
        more = len(skipped) - SKIPPED_LIST_MAX
        return {"torchyard.outputs_skipped": (
            f"{len(skipped)} files ({sum(a.size for a in skipped)} bytes) over "
            f"TORCHYARD_MLFLOW_MAX_ARTIFACT_BYTES={budget}: {names}"
            + (f" and {more} more" if more > 0 else ""))[: naming.TAG_VALUE_MAX]}

    # --- sweeps -----------------------------------------------------------------------------
    def step_sweep(self, row: TrackingExport) -> bool:
        """Create a sweep's parent run; once the sweep ended, tag its best trial and close."""
        if row.mlflow_done:
            return False
        with self.read_sessions() as session:
            sweep = store.sweep(session, row.sweep_id or 0)
            if sweep is None:
                return False
            best = self.best_trial(session, sweep) if sweep.state != "running" else None
            best_row = store.export_of_job(session, best) if best is not None else None
        if row.run_id is None:
            experiment_id = self.client.experiment_id(row.experiment or naming.DEFAULT_EXPERIMENT)
            run = self.client.run_by_tag(experiment_id, "torchyard.export_key", row.export_key)
            if run is None:
                run = self.client.create_run(experiment_id, sweep.name,
                                             timestamp_ms(_utc_seconds(sweep.created_at)),
                                             naming.sweep_tags(sweep, row.export_key))
            self.client.log_batch(run.run_id, params=naming.sweep_params(sweep.spec))
            self._write(row.id, run_id=run.run_id, experiment_id=experiment_id,
                        artifact_uri=run.artifact_uri, status=naming.RUNNING, error=None,
                        failures=0)
            return True
        if sweep.state == "running":
            return False
        if best_row is not None and best_row.mlflow and best_row.run_id is None:
            return False  # the best trial's run is still to be made
        tags = {"torchyard.state": sweep.state}
        if sweep.reason:
            tags["torchyard.reason"] = sweep.reason[: naming.TAG_VALUE_MAX]
        if best is not None:
            tags["torchyard.best_job_id"] = str(best)
            if best_row is not None and best_row.run_id:
                tags["torchyard.best_run_id"] = best_row.run_id
                self.client.log_batch(best_row.run_id, tags={"torchyard.best_trial": "true"})
        self.client.log_batch(row.run_id, tags=tags)
        status = naming.SWEEP_STATUS.get(sweep.state, naming.FINISHED)
        ended = _utc_seconds(sweep.ended_at) if sweep.ended_at else time.time()
        self.client.set_status(row.run_id, status, timestamp_ms(ended))
        self._write(row.id, status=status, mlflow_done=True, error=None, failures=0)
        return True


def _utc_seconds(naive_utc: datetime) -> float:
    """Seconds since the epoch of a naive UTC datetime (as the store keeps them)."""
    return naive_utc.replace(tzinfo=UTC).timestamp()


def _chunks(file: Any, size: int) -> Iterator[bytes]:
    left = size
    while left > 0:
        chunk = file.read(min(CHUNK_BYTES, left))
        if not chunk:
            return
        left -= len(chunk)
        yield chunk

