"""The exporter: every job's stored records to its MLflow run and its TensorBoard files, off
the supervisor's loop and off the record-ingestion path.

* **Only the acting supervisor exports.** A thread of its own looks at the outbox
  (``tracking_exports``) every ``POLL_S`` while ``lease.held()`` and hands each row with work to
  do to a pool of ``CONCURRENCY`` threads, one row to one thread at a time. Every write to the
  outbox is fenced by the lease; a new term starts from what is stored (folds refolded,
  TensorBoard files rewritten).
* **Never in the way.** Ranks post records as before and ``POST /records`` stores them and
  answers; the exporter reads them later by ``seq`` cursor. A job never waits for MLflow, and
  while the server process is busy the exporter takes a small share of its CPU
  (``service.domain.tracking.budget``) and catches up later.
* **Retries** of a row whose MLflow call failed wait ``RETRY_FIRST_S``, doubling up to
  ``RETRY_MAX_S`` (plus up to 10 % jitter), for as long as it takes: the row says why
  (``GET /jobs/{id}``: ``mlflow.state`` ``error: …``) and nothing is lost meanwhile. TensorBoard
  files do not wait for MLflow.

The MLflow steps are ``service.domain.tracking.runexport`` (their exactly-once protocol is
there), the TensorBoard ones ``service.domain.tracking.tbexport``.
"""

import logging
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta

import httpx
from sqlalchemy.orm import Session, sessionmaker

from service.domain.lease import Lease
from service.domain.tracking import naming
from service.domain.tracking.budget import CpuBudget
from service.domain.tracking.mlflowclient import MlflowClient, MlflowError
from service.domain.tracking.runexport import Deposed, RunExporter
from service.domain.tracking.tbexport import TensorBoardExporter
from service.settings import Settings
from service.store import tracking as store
from service.store.clock import utcnow
from service.store.db import is_busy
from service.store.tables import Sweep
from service.store.tracking import Pending
from torchyard_contract.state import TERMINAL_STATES

logger = logging.getLogger(__name__)

POLL_S = 0.25
# After rounds that found nothing to do the poll slows down, doubling up to this (a job's new
# records then wait at most this long; a submit in this process wakes it at once).
IDLE_POLL_S = 1.0
CONCURRENCY = 4
SCAN_LIMIT = 1000
RETRY_FIRST_S = 0.5
RETRY_MAX_S = 30.0
JITTER = 0.1
TIMEOUT_S = httpx.Timeout(30.0, connect=5.0)
NOT_CONFIGURED = ("this server exports to no MLflow tracking server now "
                  "(TORCHYARD_MLFLOW_TRACKING_URI is unset)")
NOT_CONFIGURED_RETRY_S = 3600.0
_TERMINAL = frozenset(s.value for s in TERMINAL_STATES)


def retry_delay_s(failures: int) -> float:
    """Wait before the next try after ``failures`` failed ones: doubling, capped, jittered."""
    return min(RETRY_FIRST_S * 2 ** min(failures, 30), RETRY_MAX_S) * (1 + JITTER * random.random())


@dataclass
class Exporter:
    settings: Settings
    # Writers with a short lock wait (the loop's): a busy database only delays an export.
    sessions: sessionmaker[Session]
    read_sessions: sessionmaker[Session]
    lease: Lease
    best_trial: Callable[[Session, Sweep], int | None]
    _stop: threading.Event = field(default_factory=threading.Event)
    _wake: threading.Event = field(default_factory=threading.Event)
    _inflight: set[int] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _thread: threading.Thread | None = None
    _pool: ThreadPoolExecutor | None = None
    _http: httpx.Client | None = None
    _generation: int | None = None
    # Rows whose event files could not be written (export id → the job's last seq then): tried
    # again when more records come or the job ends, and said once in the log.
    _unwritable: dict[int, int] = field(default_factory=dict)
    _budget: CpuBudget = field(default_factory=CpuBudget)

    def __post_init__(self) -> None:
        self.tensorboard = TensorBoardExporter(self.settings.runs_dir, self.sessions,
                                               self.read_sessions, self.lease)
        self.runs: RunExporter | None = None
        uri = self.settings.mlflow_tracking_uri
        if uri:
            self._http = httpx.Client(
                timeout=TIMEOUT_S, follow_redirects=False,
                limits=httpx.Limits(max_connections=CONCURRENCY,
                                    max_keepalive_connections=CONCURRENCY))
            token = self.settings.mlflow_token
            client = MlflowClient(uri, self._http, token.get_secret_value() if token else None)
            self.runs = RunExporter(self.settings, client, self.sessions, self.read_sessions,
                                    self.lease, self.best_trial)

    @property
    def enabled(self) -> bool:
        return self.runs is not None or self.settings.tensorboard

    def start(self) -> None:
        if not self.enabled:
            return
        self._pool = ThreadPoolExecutor(max_workers=CONCURRENCY,
                                        thread_name_prefix="torchyard-tracking")
        self._thread = threading.Thread(target=self._run, name="torchyard-tracking", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop picking rows; a step in flight ends within the HTTP timeout, and what it did
        not record is done again by the next supervisor."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
        self.tensorboard.forget()
        if self._http is not None:
            self._http.close()

    def wake(self) -> None:
        self._wake.set()

    def _run(self) -> None:
        poll_s = POLL_S
        while not self._stop.is_set():
            handed = 0
            try:
                handed = self.export_due()
            except Exception as exc:  # nothing may end the thread
                if is_busy(exc):
                    logger.warning("tracking: database busy, trying again: %s",
                                   getattr(exc, "orig", exc))
                else:
                    logger.exception("tracking: a round failed")
            poll_s = POLL_S if handed or self._inflight else min(poll_s * 2, IDLE_POLL_S)
            if self._wake.wait(poll_s):
                poll_s = POLL_S
            self._wake.clear()

    def export_due(self) -> int:
        """Hand every row with work to the pool; returns how many. Only while supervising."""
        if not self.lease.held() or self._pool is None:
            return 0
        if self.lease.generation != self._generation:  # a new term: nothing held is trusted
            self._forget_all()
            self._generation = self.lease.generation
        with self.read_sessions() as session:
            pending = store.unfinished(session, SCAN_LIMIT)
        if len(pending) < SCAN_LIMIT:  # writers of rows that are done or gone
            live = {p.export.id for p in pending}
            with self._lock:
                busy = set(self._inflight)
            for export_id in self.tensorboard.held() - live - busy:
                self.tensorboard.forget(export_id)
        handed = 0
        for item in pending:
            if not self._budget.allows():
                break  # the process is busy: the rest waits for the next round
            with self._lock:
                if item.export.id in self._inflight or not self._has_work(item):
                    continue
                self._inflight.add(item.export.id)
            self._pool.submit(self._export, item)
            handed += 1
        return handed

    def _forget_all(self) -> None:
        self._unwritable.clear()
        self.tensorboard.forget()
        if self.runs is not None:
            self.runs.forget()

    def _tensorboard_work(self, item: Pending) -> bool:
        e = item.export
        if not e.tensorboard or e.tensorboard_done or e.job_id is None:
            return False
        if not self.settings.tensorboard:
            return True  # turned off since: the row is told so
        ended = item.state in _TERMINAL
        failed_at = self._unwritable.get(e.id)
        if failed_at is not None and item.last_seq <= failed_at and not ended:
            return False
        written = self.tensorboard.written_through(e.id)
        if written is None:  # files are made with the first record (or at the end)
            return item.last_seq > 0 or ended
        return item.last_seq > written or ended

    def _mlflow_work(self, item: Pending) -> bool:
        e = item.export
        if not e.mlflow or e.mlflow_done or e.next_try_at > utcnow():
            return False
        if self.runs is None:
            return e.error != NOT_CONFIGURED
        if e.run_id is None or item.state is None:
            return True
        if e.sweep_id is not None:
            return item.state != "running"
        ended = item.state in _TERMINAL
        status = naming.job_status(item.state, item.ran)
        return e.sent_seq > e.acked_seq or item.last_seq > e.acked_seq or ended or (
            status != e.status)

    def _has_work(self, item: Pending) -> bool:
        return self._tensorboard_work(item) or self._mlflow_work(item)

    def _export(self, item: Pending) -> None:
        progress = False
        started = time.thread_time()
        try:
            if self._tensorboard_work(item):
                progress |= self._export_tensorboard(item)
            if self._mlflow_work(item):
                progress |= self._export_mlflow(item)
        except Deposed:
            self._forget_all()
        except Exception as exc:
            level = logging.WARNING if is_busy(exc) else logging.ERROR
            logger.log(level, "tracking: export %s (job %s, sweep %s) failed: %r",
                       item.export.id, item.export.job_id, item.export.sweep_id, exc)
        finally:
            self._budget.spend(time.thread_time() - started)
            with self._lock:
                self._inflight.discard(item.export.id)
            if progress:
                self._wake.set()  # more may be waiting: come back at once

    def _export_tensorboard(self, item: Pending) -> bool:
        e = item.export
        nothing = item.last_seq == 0 and self.tensorboard.written_through(e.id) is None
        if not self.settings.tensorboard or (nothing and item.state in _TERMINAL):
            self._write(e.id, tensorboard_done=True)  # off since, or over without a record
            return True
        try:
            written = self.tensorboard.step(e)
        except OSError as exc:  # the run directory is gone or the job made it unusable
            if e.id not in self._unwritable:
                logger.warning("job %s: TensorBoard files not written: %s", e.job_id, exc)
            self._unwritable[e.id] = item.last_seq
            if item.state in _TERMINAL:
                self._write(e.id, tensorboard_done=True)  # nothing more will come
                self._unwritable.pop(e.id, None)
            return False
        self._unwritable.pop(e.id, None)
        return written

    def _export_mlflow(self, item: Pending) -> bool:
        e = item.export
        if self.runs is None:
            self._write(e.id, error=NOT_CONFIGURED,
                        next_try_at=utcnow() + timedelta(seconds=NOT_CONFIGURED_RETRY_S))
            return False
        try:
            if e.sweep_id is not None:
                return self.runs.step_sweep(e)
            return self.runs.step_job(e)
        except MlflowError as exc:
            self.runs.forget(e.id)
            delay = retry_delay_s(e.failures)
            if e.failures == 0 or str(exc) != e.error:
                logger.warning("job %s: MLflow export: %s (try %d; again in %.1f s)",
                               e.job_id if e.job_id is not None else f"of sweep {e.sweep_id}",
                               exc, e.failures + 1, delay)
            self._write(e.id, error=str(exc), failures=e.failures + 1,
                        next_try_at=utcnow() + timedelta(seconds=delay))
            return False

    def _write(self, export_id: int, **values: object) -> None:
        with self.sessions() as session:
            if not self.lease.fence(session):
                raise Deposed()
            store.update_export(session, export_id, **values)
            session.commit()
