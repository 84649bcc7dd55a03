"""Recovery at the start of each lease term, before anything is launched.

Live groups are adopted (watched like ones this process started); dead ones get a final state
through the reaper. Jobs holding resources are looked at too, whatever their state: a job
cancelled just before the server stopped is terminal but its group may still be stopping (it
is adopted, and the stops end it) or gone (its resources are freed now). A launched job whose
reference was never stored (the last server died between starting its attempt loop and storing
it) is adopted from the loop's claim on its run directory, or its launch is given up
(``torchyard_contract.claim``).
"""

import logging
from dataclasses import dataclass

from service.domain.loop.context import LoopContext
from service.domain.loop.reaping import Reaper
from service.store import repository as repo
from torchyard_contract import claim as runclaim
from torchyard_contract.rundir import RunDir

logger = logging.getLogger(__name__)

NEVER_STARTED = "the server stopped while launching the job; it never started"


@dataclass
class Recovery:
    ctx: LoopContext
    reaper: Reaper

    def recover(self) -> bool:
        """Adopt or finish every job left by the last term; False when this process does not
        hold the lease (nothing done)."""
        ctx = self.ctx
        dead: dict[int, str | None] = {}
        with ctx.loop_sessions() as session:
            if not ctx.lease.fence(session):
                return False
            holders = set(repo.allocated_resources(session).values())
            jobs = {job.id: job for job in repo.active_jobs(session)}
            # Queued but already handed to the executor (Slurm: pending in its queue).
            jobs.update({job.id: job for job in repo.queued_with_reference(session)})
            for job_id in holders - set(jobs):
                job = repo.get_job(session, job_id)
                if job is not None:
                    jobs[job_id] = job
            for job in jobs.values():
                ref, executor = job.executor_ref, job.executor
                if ref and not ctx.executor.reachable(ref):
                    logger.info("job %s: left alone: it runs where this server cannot adopt it "
                                "(%s %s)", job.id, job.executor, ref)
                    continue
                if not ref:
                    ref = self._reference_from_claim(job.id)
                    if ref is None:
                        dead[job.id] = NEVER_STARTED
                        continue
                    executor = ctx.executor.name
                    repo.set_executor_ref(session, job.id, executor, ref)
                if executor == ctx.executor.name and ctx.executor.adopt(ref):
                    ctx.watched.refs[job.id] = ref
                    logger.info("job %s: re-adopted (%s %s)", job.id, executor, ref)
                    continue
                dead[job.id] = None
            session.commit()
        for job_id, reason in dead.items():
            try:
                self.reaper.finish(job_id, None, reason=reason)
            except Exception:  # the server starts anyway; the next start tries again
                logger.exception("job %s: could not be finished at start-up", job_id)
        return True

    def _reference_from_claim(self, job_id: int) -> str | None:
        """The attempt loop's reference from its claim, or None after giving the launch up."""
        run = RunDir.for_job(self.ctx.settings.runs_dir, job_id)
        found = runclaim.claim(run, {runclaim.ABANDONED: f"recovery of job {job_id}"})
        if found is None or runclaim.is_abandoned(found):
            logger.info("job %s: launched but never started; its launch is given up", job_id)
            return None
        return self.ctx.executor.reference_from_claim(found)
