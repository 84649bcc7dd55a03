"""Pausing and resuming jobs (docs/lifecycle.md, "Pause and resume").

The database decides first (compare-and-set, ``torchyard_contract.state``): a queued job becomes
``paused`` at once; a starting or running one becomes ``pausing``, and the loop's
:meth:`Pauses.tell_pausing` then writes its ``RUN_DIR/pause.json``, which the job's attempt loop
acts on (``service.run.pausesignal``: SIGTERM to the ranks, ``pause_grace_s``, then a stop). When the
loop ends with the outcome ``paused``, the finisher makes the job ``paused`` and its resources are
free. A queued job the executor already holds (pending in Slurm's queue) is withdrawn from it
(``service.domain.loop.stops``) and submitted again when resumed. ``resume`` makes a paused job
``queued``: it waits by priority, then by id, as any queued job, and its next launch goes on
from its last checkpoint as a new attempt. A pause uses no restart.
"""

import json
import logging
import time
from dataclasses import dataclass

from sqlalchemy.orm import Session

from service.domain.loop.context import LoopContext
from service.store import repository as repo
from service.store.tables import Job
from torchyard_contract import runwrite
from torchyard_contract.rundir import RunDir
from torchyard_contract.state import JobState

logger = logging.getLogger(__name__)

USER_PAUSE = "paused by user"


class PauseRefused(Exception):
    """The job is in a state that cannot be paused or resumed (``state`` names it)."""

    def __init__(self, state: str, message: str) -> None:
        super().__init__(message)
        self.state = state


@dataclass
class Pauses:
    ctx: LoopContext

    def pause(self, job_id: int, why: str = USER_PAUSE) -> Job | None:
        """queued → paused, starting/running → pausing. A job already pausing or paused is
        returned unchanged; None if there is no such job; raises ``PauseRefused`` when it has
        ended. A user's pause stays until a user resumes, even of a job a preemption had
        queued again (``preempted_by`` is cleared, so ``resume_preempted`` leaves it)."""
        extra: dict[str, object] = {"reason": why, "preempted_by": None}
        with self.ctx.sessions() as session:
            won = repo.transition(session, job_id, JobState.paused, **extra,
                                  pauses=Job.pauses + 1, only_from=JobState.queued)
            if not won:
                won = repo.transition(session, job_id, JobState.pausing, **extra)
            if not won:  # pausing or paused for a preemption: now for the user, so it stays
                repo.keep_paused(session, job_id, why)
            session.commit()
            job = repo.get_job(session, job_id)
        if job is not None and not won and job.state not in (JobState.pausing, JobState.paused):
            raise PauseRefused(job.state, f"job {job_id} is {job.state}: only a queued, "
                               "starting or running job can be paused")
        if won:
            logger.info("job %s: %s (%s)", job_id, job.state if job else "?", why)
            self.ctx.queue_changed()
        return job

    def resume(self, job_id: int) -> Job | None:
        """paused → queued; None if there is no such job; raises ``PauseRefused`` when the job
        is not paused (a pausing one is resumed once it is paused)."""
        with self.ctx.sessions() as session:
            won = repo.transition(session, job_id, JobState.queued, reason=None,
                                  preempted_by=None, executor_ref=None,
                                  only_from=JobState.paused)
            session.commit()
            job = repo.get_job(session, job_id)
        if job is not None and not won:
            raise PauseRefused(job.state, f"job {job_id} is {job.state}: only a paused job "
                               "can be resumed")
        if won:
            logger.info("job %s: resumed", job_id)
            self.ctx.queue_changed()
        return job

    def preempt(self, session: Session, job_id: int, by: int, why: str | None = None) -> bool:
        """running/starting → pausing to make room for job ``by`` (a scheduling pass, in its
        session, under the lease's fence); True if it won. Counted in ``preemptions``. ``why``:
        the reason it is paused and then waits (default ``preempted by job <by>``; a reclaim
        says which team gets its slots back)."""
        return repo.transition(session, job_id, JobState.pausing,
                               reason=why or f"preempted by job {by}", preempted_by=by,
                               preemptions=Job.preemptions + 1)

    def resume_preempted(self) -> None:
        """A loop step: preempted jobs, once paused, are queued again at once (keeping why
        they wait: "preempted by job 12"), ahead of later jobs of their priority by id."""
        ctx = self.ctx
        # Look before taking the fence (as ``Stops.fail_stop_requests`` does): the usual tick
        # has nothing to resume and should not open a write transaction.
        with ctx.read_sessions() as session:
            if not repo.preempted_and_paused(session):
                return
        with ctx.loop_sessions() as session:
            if not ctx.lease.fence(session):
                return
            resumed = [job_id for job_id in repo.preempted_and_paused(session)
                       if repo.transition(session, job_id, JobState.queued, executor_ref=None,
                                          only_from=JobState.paused)]
            session.commit()
        if resumed:
            logger.info("jobs %s: preempted and paused; queued again", resumed)
            ctx.queue_changed()

    def tell_pausing(self) -> None:
        """A loop step: every watched pausing job's attempt loop gets its request file, once
        per term (writing it again is harmless: a new term does, in case the last one could not)."""
        ctx = self.ctx
        watched = ctx.watched
        candidates = [j for j in watched.refs if j not in watched.told_to_pause]
        if not candidates:
            return
        with ctx.read_sessions() as session:
            pausing = set(repo.ids_in_state(session, JobState.pausing)) & set(candidates)
        for job_id in sorted(pausing):
            run = RunDir.for_job(ctx.settings.runs_dir, job_id)
            # Confined: the run directory may be the job's user's (torchyard_contract.runwrite).
            runwrite.write_file(run.pause_request,
                                json.dumps({"requested_at": time.time()}).encode())
            watched.told_to_pause.add(job_id)
            logger.info("job %s: asked its attempt loop to pause", job_id)
