"""Finishing ended jobs off the supervisor's loop: attempts, spool re-ingestion, terminal state.

When a job's attempt loop has ended, the supervisor frees its resources at once and hands the
job here (``enqueue``). A thread of its own then, one job at a time:

1. stores the attempt records, read strictly (``torchyard_contract.runfiles``);
2. re-ingests the ranks' spool files (``service.domain.records.spool``) from each rank's acknowledged offset, at
   most ``spool_ingest_max_records`` per rank, in batches each stored in a transaction of its
   own (the write lock is free between them), stopping as soon as the job is no longer active
   (a user's cancel won);
3. turns the job terminal with the attempt loop's outcome, or ``failed`` saying why there is none; the
   reason notes spool records left unread. Two outcomes are no end: ``paused`` (the job holds
   nothing until resumed) and ``requeue`` (``retry_elsewhere`` on Slurm: the job is ``queued``
   again and its next allocation excludes the failing node, ``_requeue``).

Only then is the job terminal, so a follower that sees a terminal state and then an empty page
has seen every record (docs/metrics.md). An error finishing one job fails that job with the
error as its reason; the thread goes on with the next. A busy database (a lock held elsewhere
past the lock timeout, ``service.store.db.is_busy``) is not the job's fault: the job is finished again
``BUSY_RETRY_S`` later, from the start (every step is idempotent).
"""

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from sqlalchemy.orm import Session, sessionmaker

from service.domain.records.ingest import accept_records
from service.domain.records.scope import job_attempts
from service.domain.records.spool import SpoolChunk, SpoolTally, read_rank_spool
from service.store import repository as repo
from service.store.db import is_busy
from service.store.tables import Job
from torchyard_contract.attempts import spec_world_size
from torchyard_contract.bounds import bounded_text
from torchyard_contract.nodes import EXCLUDE_NODES_MAX
from torchyard_contract.rundir import RunDir
from torchyard_contract.runfiles import REQUEUE, read_outcome
from torchyard_contract.state import ACTIVE_STATES, JobState

logger = logging.getLogger(__name__)

_STOP = -1
BUSY_RETRY_S = 1.0


def _resumed_since(job: Job, ref: str | None) -> bool:
    """What ended (executor reference ``ref``) was a submission withdrawn by a pause, and the job
    has been resumed since: queued again, without that reference. Its end is not the job's."""
    return ref is not None and job.executor_ref != ref and job.state == JobState.queued.value


@dataclass(frozen=True)
class Ended:
    """A job whose attempt loop ended; ``loop_exit_code`` None when it ended unwatched; ``why``: the
    executor's account of the end (Slurm's state), used when there is no outcome file."""

    job_id: int
    loop_exit_code: int | None
    why: str | None = None
    reason: str | None = None  # why it failed if it left no outcome, when known better
    # When the supervisor saw its processes end (and freed its resources): the job's ended_at,
    # not the later moment its spools were stored. None: now (it ended while no one watched).
    ended_at: datetime | None = None
    # The executor cancelled it (Slurm: an operator's scancel, maybe while pending): without an
    # outcome file it ends ``cancelled`` (issue 25, item 5), not ``failed``.
    cancelled: bool = False
    # The executor's reference of what ended; None when unknown. A job that no longer has it
    # (paused while pending in Slurm, then resumed: service.domain.loop.pauses) has nothing to finish.
    ref: str | None = None


@dataclass
class Finisher:
    runs_dir: Path
    session_factory: sessionmaker[Session]
    max_records_per_rank: int
    on_finished: Callable[[], None] = lambda: None  # the supervisor re-plans (nothing to free)
    # Checked first in every writing transaction: False = this process no longer supervises
    # (``service.domain.lease``), so it writes nothing and the next supervisor finishes the job.
    fence: Callable[[Session], bool] = lambda _session: True
    # The executor's ``excludes_nodes``: a ``requeue`` outcome queues the job again (Slurm);
    # False: no attempt loop of this executor writes one, so a job's that does fails.
    excludes_nodes: bool = False
    # A job seen started only here (an executor's job that ended before a pass saw it run):
    # its usage run opens (``reaping.open_executor_run``), closed as it ends.
    opened: Callable[[Session, int], None] = lambda _session, _job_id: None
    _queue: queue.Queue[Ended | int] = field(default_factory=queue.Queue)
    _pending: set[int] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _thread: threading.Thread | None = None
    _halt: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="torchyard-finisher", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 10) -> None:
        """Stop between two batches: the job in hand and those still queued stay active in the
        database (their resources already free) and are finished by the next start's recovery;
        re-reading is idempotent."""
        self._halt.set()
        self._queue.put(_STOP)
        if self._thread is not None:
            self._thread.join(timeout=timeout_s)

    def enqueue(
        self, job_id: int, loop_exit_code: int | None, why: str | None = None,
        reason: str | None = None, ended_at: datetime | None = None, cancelled: bool = False,
        ref: str | None = None,
    ) -> None:
        """Finish ``job_id`` soon (once: a job already waiting is not queued twice)."""
        with self._lock:
            if job_id in self._pending:
                return
            self._pending.add(job_id)
        self._queue.put(Ended(job_id, loop_exit_code, why, reason, ended_at, cancelled, ref))

    def is_pending(self, job_id: int) -> bool:
        with self._lock:
            return job_id in self._pending

    def _run(self) -> None:
        while isinstance(item := self._queue.get(), Ended) and not self._halt.is_set():
            try:
                self.finish(item.job_id, item.loop_exit_code, item.why, item.reason, item.ended_at,
                            item.cancelled, item.ref)
            except Exception as exc:  # one job's failure must not stop the others'
                if is_busy(exc):
                    logger.warning("job %s: finishing again in %gs, the database is busy: %s",
                                   item.job_id, BUSY_RETRY_S, getattr(exc, "orig", exc))
                    self._halt.wait(BUSY_RETRY_S)
                    self._queue.put(item)  # still pending: not queued twice meanwhile
                    continue
                logger.exception("job %s: finishing failed", item.job_id)
                self._fail(item.job_id, f"torchyard could not finish this job: {exc!r}")
            with self._lock:
                self._pending.discard(item.job_id)
            self.on_finished()

    def finish(
        self, job_id: int, loop_exit_code: int | None, why: str | None = None,
        reason: str | None = None, ended_at: datetime | None = None, cancelled: bool = False,
        ref: str | None = None,
    ) -> None:
        """Steps 1–3 of the module docstring, for one job (callable directly, e.g. by tests)."""
        run = RunDir.for_job(self.runs_dir, job_id)
        with self.session_factory() as session:
            if not self.fence(session):
                return
            job = repo.get_job(session, job_id)
            if job is None:
                return
            if _resumed_since(job, ref):
                return
            # It ended before a tick saw it start (a Slurm job, fast or purged meanwhile): a
            # queued job becomes starting first, so its spools are stored and it may end.
            if repo.transition(session, job_id, JobState.starting, started_at=repo.utcnow()):
                self.opened(session, job_id)  # its run is as short as what was seen of it
            spec = dict(job.spec or {})
            ranks = spec_world_size(spec)
            # Named by a guard's stop already here: a reader between this commit and ``_end``
            # must not see the last attempt "cancelled" by the guard's own SIGTERM.
            repo.set_attempts(session, job_id, _named_by_stop(
                job_attempts(run, spec, job.pauses or 0), job.stop_reason))
            session.commit()
        notes, added = [], 0
        for rank in range(ranks):
            tally = SpoolTally(rank)
            for chunk in read_rank_spool(run, rank, tally, self.max_records_per_rank):
                if self._halt.is_set():
                    logger.info("job %s: finishing interrupted by shutdown", job_id)
                    return
                stored = self._store(job_id, chunk)
                if stored is None:
                    break  # the job is no longer active: nothing more is stored
                added += stored
            if note := tally.describe(run.spool_file(rank)):
                notes.append(note)
        self._end(job_id, run, loop_exit_code, notes, why, reason, ended_at, cancelled, ref)
        logger.info("job %s: finished; %d spooled records recovered", job_id, added)

    def _store(self, job_id: int, chunk: SpoolChunk) -> int | None:
        """One batch in one transaction; None once the job is not active (stop reading)."""
        with self.session_factory() as session:
            if not self.fence(session):
                return None
            job = repo.get_job(session, job_id)
            if job is None or JobState(job.state) not in ACTIVE_STATES:
                return None
            # Records that never reached the API are checked and guarded alike.
            added = accept_records(session, job, chunk.records, refuse_whole=False)
            session.commit()
            return added

    def _end(
        self, job_id: int, run: RunDir, loop_exit_code: int | None, notes: list[str], why: str | None,
        known: str | None = None, ended_at: datetime | None = None, cancelled: bool = False,
        ref: str | None = None,
    ) -> None:
        outcome = read_outcome(run)
        requeued = outcome is not None and outcome.state == REQUEUE
        if outcome is None and cancelled:
            state, exit_code = JobState.cancelled, None
            reason = f"cancelled outside torchyard ({why})" if why else "cancelled outside torchyard"
        elif outcome is None:
            state = JobState.failed
            exit_code = None
            reason = known or (
                "the job's attempt loop ended without a readable outcome"
                if loop_exit_code is not None or why is not None
                else "the job ended while the server was down and left no readable outcome"
            )
            reason = f"{reason} ({why})" if why else reason
        elif requeued:  # where to: ``_requeue``, with the job's row
            state, exit_code = JobState.queued, outcome.exit_code
            reason = outcome.reason or "restarted elsewhere"
        else:
            state = JobState(outcome.state)
            exit_code = outcome.exit_code
            reason = outcome.reason or ("cancelled" if state is JobState.cancelled else None)
        if notes:
            reason = "; ".join([reason, *notes] if reason else notes)
        with self.session_factory() as session:
            if not self.fence(session):
                return
            job = repo.get_job(session, job_id)
            if job is not None and _resumed_since(job, ref):
                return  # resumed while its spools were read: the next submission is its own
            if job is not None and job.state == JobState.paused.value:
                # Paused while an executor still held it queued (Slurm): withdrawn, not ended.
                repo.release(session, job_id)
                repo.clear_executor_ref(session, job_id)
                session.commit()
                return
            stop_reason = job.stop_reason if job is not None else None
            fields: dict[str, object] = {}
            only_from: JobState | None = None
            if requeued and outcome is not None and job is not None:
                state, reason, fields, only_from = _requeue(
                    job, outcome.exclude_nodes, reason, self.excludes_nodes)
            elif state is JobState.paused and job is not None:
                if job.state == JobState.pausing.value:
                    # The pause's own reason stays ("paused by user", "preempted by job 12").
                    reason = job.reason
                    fields = {"pauses": Job.pauses + 1, "executor_ref": None}
                else:  # the job's own processes may write exit.json: a pause nobody asked for
                    state = JobState.failed
                    reason = "the job's outcome says paused, but it was not asked to pause"
            if job is not None:
                repo.set_attempts(session, job_id, _closed_attempts(
                    job.attempts or [], stop_reason, stop_reason or reason))
            if stop_reason is not None:
                # A guard tripped (maybe just before the job ended on its own): it failed.
                state, reason = JobState.failed, stop_reason
            if state not in (JobState.paused, JobState.queued):
                fields["ended_at"] = ended_at or repo.utcnow()
            won = repo.transition(session, job_id, state, only_from=only_from, exit_code=exit_code,
                                  reason=bounded_text(reason) if reason else None, **fields)
            if not won and job is not None:
                repo.set_exit_code_if_unknown(session, job_id, exit_code)
            repo.release(session, job_id)
            session.commit()

    def _fail(self, job_id: int, reason: str) -> None:
        try:
            with self.session_factory() as session:
                if not self.fence(session):
                    return
                repo.transition(session, job_id, JobState.failed, reason=reason)
                repo.release(session, job_id)
                session.commit()
        except Exception:
            logger.exception("job %s: could not even be failed", job_id)


def _requeue(
    job: Job, nodes: list[str], reason: str | None, allowed: bool
) -> tuple[JobState, str | None, dict[str, object], JobState | None]:
    """Where a ``requeue`` outcome takes ``job`` (state, reason, fields, the state it must still
    be in): ``queued`` again with the outcome's nodes added to those it excludes and no executor
    reference, so the scheduler submits it anew; ``paused`` when a pause was asked meanwhile
    (its next launch excludes them too); ``failed`` when it cannot be honoured."""
    if not allowed:
        return JobState.failed, (
            "the job's outcome asks for a restart on another node (requeue), which this "
            "executor does not do (only a Slurm job's attempt loop asks for one)"), {}, None
    if not nodes:
        return JobState.failed, "the job's outcome asks for a restart on another node but " \
            "names no node to exclude", {}, None
    before = [n for n in job.exclude_nodes or [] if isinstance(n, str)]
    merged = list(dict.fromkeys([*before, *nodes]))
    if len(merged) > EXCLUDE_NODES_MAX:
        return JobState.failed, (f"not restarted elsewhere: it would exclude {len(merged)} "
                                 f"nodes, more than {EXCLUDE_NODES_MAX}; {reason}"), {}, None
    fields: dict[str, object] = {"exclude_nodes": merged, "executor_ref": None}
    if job.state == JobState.pausing.value:  # the pause's own reason stays
        return JobState.paused, job.reason, {**fields, "pauses": Job.pauses + 1}, JobState.pausing
    return JobState.queued, reason, fields, JobState(job.state)


def _named_by_stop(attempts: list[dict], stopped_by: str | None) -> list[dict]:
    """The attempts (copies), the last one's reason ``stopped_by`` when a guard stopped the job."""
    named = [dict(a) for a in attempts]
    if stopped_by and named:
        named[-1]["reason"] = stopped_by
    return named


def _closed_attempts(attempts: list[dict], stopped_by: str | None, why: str | None) -> list[dict]:
    """The job's attempts as they end: an attempt its attempt loop never closed (killed when a stop's
    grace ran out) ends now, never left running forever; ``stopped_by`` — a guard's reason, with
    which the job fails — names the last one, whatever the attempt loop made of the stop: a cancel when
    the SIGTERM reached it first, torchrun's exit when torchrun ended (on the group's SIGTERM)
    before the attempt loop saw the stop request, or a success that came just after the trip."""
    closed = _named_by_stop(attempts, stopped_by)
    for attempt in closed:
        if attempt.get("ended_at") is None:
            attempt["ended_at"] = time.time()
            attempt["reason"] = attempt.get("reason") or why or "the job's attempt loop ended"
    return closed
