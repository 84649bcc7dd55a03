"""Stopping the groups of jobs that ended in the database while their processes still run.

A loss guard's stop request (``service.domain.records.lossguard``) fails the job with its reason, in the
database first (compare-and-set); a cancel does the same through ``Supervisor.cancel``. Then,
for every watched job the database calls terminal, the executor stops its group (SIGTERM →
grace → SIGKILL) on a thread of its own, and the reaper records the exit.
"""

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from service.domain.loop.context import LoopContext
from service.store import repository as repo
from torchyard_contract.state import TERMINAL_STATES, JobState

logger = logging.getLogger(__name__)

# States whose group must not run: ended, and paused while an executor held it queued (Slurm's
# pending job is withdrawn; service.domain.loop.pauses).
_STOPPED = TERMINAL_STATES | {JobState.paused}


@dataclass
class Stops:
    ctx: LoopContext
    wake: Callable[[], None]  # the reaper then records the exit and frees the resources

    def fail_stop_requests(self) -> None:
        """Jobs a loss guard asked to stop fail with its reason; ``stop_ended`` stops them."""
        ctx = self.ctx
        # Look before taking the fence: a write transaction every tick is most of an idle
        # server's CPU. The fenced pass below reads the requests again.
        with ctx.read_sessions() as session:
            if not repo.stop_requested(session):
                return
        with ctx.loop_sessions() as session:
            if not ctx.lease.fence(session):
                return
            for job_id, reason in repo.stop_requested(session):
                if repo.transition(session, job_id, JobState.failed, reason=reason):
                    logger.info("job %s: stopped by a loss guard: %s", job_id, reason)
            session.commit()

    def stop_ended(self) -> None:
        """Jobs whose group still runs (or waits in the executor's queue) but which are terminal
        or paused in the database are stopped by the executor, each in its own thread."""
        watched = self.ctx.watched
        running = [j for j in watched.refs if j not in watched.stopping]
        if not running:
            return
        with self.ctx.loop_sessions() as session:
            for job_id in running:
                job = repo.get_job(session, job_id)
                if job is not None and JobState(job.state) in _STOPPED:
                    watched.stopping.add(job_id)
                    threading.Thread(target=self._stop_group, args=(job_id,), daemon=True).start()

    def _stop_group(self, job_id: int) -> None:
        ref = self.ctx.watched.refs.get(job_id)
        if ref is not None:
            self.ctx.executor.cancel(ref, self.ctx.settings.stop_grace_s)
        self.wake()
