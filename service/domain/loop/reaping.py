"""Following the jobs this process watches: started, ready, ended.

Each pass asks the executor about every watched job at once (``describe``). An executor that
queues jobs itself reports the pending ones (they stay ``queued`` with its reason) and the ones
it started (→ ``starting``). A job whose attempt loop ended has its resources freed at once and
is handed to the finisher (``service.domain.loop.finisher``), which re-ingests its spools and makes it
terminal on its own thread. Attempts are synced from the run directory, and a job becomes
``running`` once rank 0 of an attempt is ready.
"""

import logging
import time
from dataclasses import dataclass

from sqlalchemy.orm import Session

from service.domain.loop.context import LoopContext
from service.domain.loop.finisher import Finisher
from service.domain.queue import scheduler
from service.domain.records.scope import job_attempts
from service.executor.base import Phase, Status
from service.store import repository as repo
from service.store import usage
from service.store.db import is_busy
from service.store.tables import Job
from torchyard_contract.rundir import RunDir
from torchyard_contract.state import JobState

logger = logging.getLogger(__name__)


def open_executor_run(session: Session, job_id: int) -> None:
    """A job the executor placed (Slurm) holds its slots from now: its usage run opens, with
    one slot per rank (``nproc_per_node × nnodes``); the release that ends it closes it."""
    job = repo.get_job(session, job_id)
    spec = (job.spec or {}) if job is not None else {}
    slots = int(spec.get("nproc_per_node") or 1) * int(spec.get("nnodes") or 1)
    usage.open_run(session, job_id, slots, time.time())


@dataclass
class Reaper:
    ctx: LoopContext
    finisher: Finisher

    def reap_finished(self) -> None:
        watched = self.ctx.watched
        if not watched.refs:
            return
        statuses = self.ctx.executor.describe(dict(watched.refs))
        if self.ctx.executor.queues_jobs:
            self._sync_executor_queue(statuses)
        for job_id, status in statuses.items():
            if status.phase is not Phase.ended or self._outcome_pending(job_id, status):
                continue
            ref = watched.refs.get(job_id)
            watched.forget(job_id)
            self.finish(job_id, status.exit_code, status.reason, cancelled=status.cancelled,
                        ref=ref)

    def _outcome_pending(self, job_id: int, status: Status) -> bool:
        """The job ran and ended but its outcome file is not visible here yet, and the
        executor's ``outcome_visible_within_s`` has not run out (a shared filesystem's cache).
        A job the executor says never ran (cancelled while pending) is not waited for."""
        limit = self.ctx.executor.outcome_visible_within_s
        if limit <= 0 or status.never_ran or RunDir.for_job(self.ctx.settings.runs_dir, job_id).exit_file.exists():
            return False
        first = self.ctx.watched.awaiting_outcome.setdefault(job_id, time.monotonic())
        return time.monotonic() - first < limit

    def _sync_executor_queue(self, statuses: dict[int, Status]) -> None:
        """Jobs the executor holds pending stay ``queued`` with its reason; started ones (or ones
        that ended before a pass saw them run) become ``starting``."""
        ctx = self.ctx
        waiting: dict[int, scheduler.Waiting] = {}
        pending = sorted(j for j, st in statuses.items() if st.phase is Phase.pending)
        for position, job_id in enumerate(pending, start=1):
            reason = statuses[job_id].reason or "None"
            waiting[job_id] = scheduler.Waiting(position, f"Slurm: {reason}")
        # A submission being withdrawn or stopped (``watched.stopping``: paused while pending,
        # cancelled) started nothing: once its Slurm job ends, a job resumed meanwhile is queued
        # for a new submission and must not be taken for started by the old one.
        started = [j for j, st in statuses.items()
                   if st.phase is not Phase.pending and j not in ctx.watched.seen_started
                   and j not in ctx.watched.stopping]
        if started:
            with ctx.loop_sessions() as session:
                if not ctx.lease.fence(session):
                    return
                for job_id in started:
                    if repo.transition(session, job_id, JobState.starting,
                                       started_at=repo.utcnow()):
                        open_executor_run(session, job_id)
                session.commit()
            ctx.watched.seen_started.update(started)
        ctx.set_waiting(waiting)

    def finish(
        self, job_id: int, loop_code: int | None, why: str | None = None,
        reason: str | None = None, cancelled: bool = False, ref: str | None = None,
    ) -> None:
        """Free the job's resources now; the finisher re-ingests its spools and makes it
        terminal, off this thread. ``loop_code``: the attempt loop's exit code, None when unknown
        (it ended unwatched); ``why``: the executor's account of the end (Slurm's state), used
        when there is no outcome file; ``reason``: why it failed if it left no outcome, when
        known better than that; ``cancelled``: the executor cancelled it (see ``Status``);
        ``ref``: the executor's reference of what ended, when known."""
        ctx = self.ctx
        ended = repo.utcnow()  # before the release: a job started on its slots starts after
        try:
            with ctx.loop_sessions() as session:
                if not ctx.lease.fence(session):
                    return
                repo.release(session, job_id)
                session.commit()
        except Exception as exc:
            if not is_busy(exc):
                raise
            # The job is no longer watched: the finisher (fenced too) frees them as it ends it.
            logger.warning("job %s: resources not freed yet, the database is busy: %s",
                           job_id, getattr(exc, "orig", exc))
        self.finisher.enqueue(job_id, loop_code, why, reason, ended_at=ended, cancelled=cancelled,
                              ref=ref)
        ctx.queue_changed()

    def mark_running(self) -> None:
        """Sync attempts from the run dir; starting → running once rank 0 of an attempt is ready.

        Only jobs this process watches: another host's run directories are not here."""
        ctx = self.ctx
        if not ctx.watched.refs:
            return
        with ctx.loop_sessions() as session:
            if not ctx.lease.fence(session):
                return
            for job in repo.active_jobs(session):
                if job.id not in ctx.watched.refs:
                    continue
                try:
                    self._sync_attempts(session, job)
                except Exception:  # one job's files must not hold the others' (or the loop)
                    logger.exception("job %s: could not read its attempts", job.id)
            session.commit()

    def _sync_attempts(self, session: Session, job: Job) -> None:
        run = RunDir.for_job(self.ctx.settings.runs_dir, job.id)
        attempts = job_attempts(run, job.spec, job.pauses or 0)
        if attempts != (job.attempts or []):
            repo.set_attempts(session, job.id, attempts)
        if job.state != JobState.starting.value or not attempts:
            return
        latest = attempts[-1]  # a resumed job's last one may be its paused launch's: ended
        if latest.get("ended_at") is None and run.ready_marker(latest["number"], 0).exists():
            # Seen up to a tick late; never after the first metric it made possible.
            now = repo.utcnow()
            running_at = min(now, job.first_metric_at) if job.first_metric_at else now
            repo.transition(session, job.id, JobState.running, running_at=running_at)
