"""The scheduling pass: which queued jobs start now.

Two strategies behind one method, chosen by the executor's capability (``queues_jobs``):

* :class:`HostScheduling` — the supervisor places jobs on this host's inventory
  (``service.domain.queue.scheduler``: fair share between teams, then priority, FIFO, gang
  allocation, backfill behind a reservation; teams' quotas and budgets from
  ``service.domain.queue.standing``) and launches them (``service.domain.loop.launch``); a job
  of a team within its quota that cannot start takes borrowed slots back
  (``service.domain.queue.reclaim``), else a more urgent one may preempt its own team's
  preemptible ones (``service.domain.queue.preemption``).
* :class:`ExecutorQueueing` — the executor queues and places jobs itself (Slurm): every queued
  job is handed to it at once, each on a submit thread (``service.domain.loop.submits``), and stays
  ``queued`` until the executor starts it (``service.domain.loop.reaping``).
"""

import logging
import math
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import UTC
from functools import partial
from typing import Protocol

from pydantic import ValidationError
from sqlalchemy.orm import Session

from service.domain.intake.scriptpath import ScriptRefused
from service.domain.intake.secretstore import SecretRefused
from service.domain.loop.context import LoopContext
from service.domain.loop.launch import RunStarter
from service.domain.loop.pauses import Pauses
from service.domain.loop.submits import Submits
from service.domain.queue import preemption, reclaim, scheduler
from service.domain.queue.fairshare import HOUR_S
from service.domain.queue.placement import capacity_shortfall, placement_for, resource_kind
from service.domain.queue.standing import Standings
from service.executor.base import ExecutorError
from service.settings.tokens import new_token
from service.store import repository as repo
from service.store.tables import Job
from torchyard_contract.spec import JobSpec
from torchyard_contract.state import JobState

logger = logging.getLogger(__name__)


class Scheduling(Protocol):
    def run_pass(self, now: float) -> None:
        """Start (or hand over) what may start now and record why the rest waits."""

    def close(self) -> None: ...


def stored_spec(session: Session, job: Job, ctx: LoopContext) -> JobSpec | None:
    """The job's spec under today's rules; a queued job stored under older rules that no longer
    validates fails with why (under the lease's fence) instead of holding the queue. None then."""
    try:
        return JobSpec.model_validate(job.spec)
    except ValidationError as exc:
        if ctx.lease.fence(session):
            repo.transition(session, job.id, JobState.failed,
                            reason=f"could not start: its stored spec is no longer valid: {exc}")
            session.commit()
        return None


@dataclass
class HostScheduling:
    ctx: LoopContext
    starter: RunStarter
    pauses: Pauses
    # Teams' usage, factors and budgets (service.domain.queue.standing), kept by this process.
    standings: Standings = field(init=False)

    def __post_init__(self) -> None:
        self.standings = Standings(self.ctx.settings.usage_half_life_h * HOUR_S)

    def run_pass(self, now: float) -> None:
        ctx = self.ctx
        # Read without the write lock: only this thread allocates, so what it reads stays true
        # until it launches (the launch itself is compare-and-set, so a job cancelled meanwhile
        # is skipped, and the allocation's unique key would refuse a double booking anyway).
        with ctx.read_sessions() as reader:
            kinds: dict[str, str] = {}  # device → kind: a few distinct ones among 10,000 jobs
            queue = [
                scheduler.QueuedJob(
                    id=job_id, priority=priority,
                    kind=kinds.get(device) or kinds.setdefault(
                        device, resource_kind(device, ctx.inventory)),
                    count=count, max_runtime_s=max_runtime_s, team=team,
                    preemptible=bool(preemptible),
                )
                for job_id, priority, device, count, max_runtime_s, team, preemptible
                in repo.queued_for_scheduling(reader)
            ]
            if not queue:
                ctx.set_waiting({})
                return
            held = repo.allocated_resources(reader)
            running, active = self._running_jobs(reader, held)
            teams = self.standings.book(reader, now, held_by_team(active))
        # Checked at submit, but a restart with fewer GPUs or slots can leave a job that never
        # fits: it would hold the head of its kind's queue forever, so it fails instead.
        never = {(kind, count) for kind, count in {(j.kind, j.count) for j in queue}
                 if capacity_shortfall(kind, count, ctx.inventory) is not None}
        if never:
            queue = [job for job in queue
                     if (job.kind, job.count) not in never or not self._fail_if_never_fits(job)]
        free = {
            kind: [r for r in ctx.inventory.resource_names(kind) if r not in held]
            for kind in (scheduler.GPU, scheduler.CPU)
        }
        max_slots = dict(teams.max_slots) if teams is not None else {}
        decision = scheduler.plan(queue, free, running, now, teams)
        with ctx.loop_sessions() as session:
            for launch in decision.launches:
                job = repo.get_job(session, launch.job_id)
                spec = stored_spec(session, job, ctx) if job is not None else None
                if job is None or spec is None:
                    continue
                self.starter.launch(session, job, spec, placement_for(spec, launch.resources))
        ctx.set_waiting(decision.waiting)
        launched = {r for launch in decision.launches for r in launch.resources}
        left = {kind: len([r for r in names if r not in launched]) for kind, names in free.items()}
        self._preempt(list(decision.heads.values()), left, active, max_slots, now)

    def _preempt(
        self, heads: list[scheduler.QueuedJob], free: dict[str, int],
        active: list[preemption.ActiveJob], max_slots: dict[str, int], now: float,
    ) -> None:
        """Pause borrowed jobs for a waiting job of a team within its quota
        (``service.domain.queue.reclaim``), else preemptible jobs of lower priority of its own
        team (``service.domain.queue.preemption``); it starts on a later pass, once they are
        paused."""
        ctx = self.ctx
        min_run_s = ctx.settings.preempt_min_run_s
        chosen: list[tuple[preemption.Preemption, scheduler.QueuedJob | None]] = []
        for head in heads:
            taken = reclaim.choose(head, free.get(head.kind, 0), active, max_slots, min_run_s,
                                   now) if max_slots else None
            if taken is not None:
                chosen.append((taken, head))
                continue
            chosen += [(p, None) for p in preemption.choose(
                [head], free, active, min_run_s, now)]
        if not chosen:
            return
        counts = {a.id: a.count for a in active}
        with ctx.loop_sessions() as session:
            if not ctx.lease.fence(session):
                return
            for decision, returned_to in chosen:
                for victim in decision.victims:
                    why = None if returned_to is None else reclaim_reason(
                        counts.get(victim, 0), returned_to.team, returned_to.id)
                    if self.pauses.preempt(session, victim, decision.for_job, why):
                        logger.info("job %s: %s", victim, why or f"preempted by job "
                                    f"{decision.for_job}")
            session.commit()

    def close(self) -> None:
        pass

    def _fail_if_never_fits(self, job: scheduler.QueuedJob) -> bool:
        shortfall = capacity_shortfall(job.kind, job.count, self.ctx.inventory)
        if shortfall is None:
            return False
        with self.ctx.loop_sessions() as session:
            if not self.ctx.lease.fence(session):
                return True  # not ours to decide now; skipped this pass
            repo.transition(session, job.id, JobState.failed, reason=shortfall)
            session.commit()
        logger.info("job %s: can never fit this host; failed", job.id)
        return True

    def _running_jobs(
        self, session: Session, held: dict[str, int]
    ) -> tuple[list[scheduler.RunningJob], list[preemption.ActiveJob]]:
        """Jobs holding resources, with the time by which their deadline ends them, and what
        preemption and reclaim need to know of them."""
        by_job: dict[int, list[str]] = {}
        for resource, job_id in held.items():
            by_job.setdefault(job_id, []).append(resource)
        running, active = [], []
        for job_id, resources in by_job.items():
            job = repo.get_job(session, job_id)
            limit = (job.spec or {}).get("max_runtime_s") if job is not None else None
            started = job.started_at if job is not None else None
            # The attempt loop stops a job at its deadline with SIGTERM → grace → SIGKILL.
            ends_by = (
                started.replace(tzinfo=UTC).timestamp() + limit + self.ctx.settings.stop_grace_s
                if limit is not None and started is not None
                else math.inf
            )
            kind = scheduler.GPU if resources[0].startswith("gpu:") else scheduler.CPU
            running.append(scheduler.RunningJob(job_id, kind, len(resources), ends_by))
            if job is not None:
                active.append(preemption.ActiveJob(
                    job_id, job.priority, kind, len(resources),
                    started.replace(tzinfo=UTC).timestamp() if started is not None else time.time(),
                    bool(job.preemptible) and started is not None,
                    job.state == JobState.pausing.value, bool(job.preemptions), job.team))
        return running, active


def held_by_team(active: list[preemption.ActiveJob]) -> dict[str | None, int]:
    """Slots each team's jobs hold (pausing ones too: they hold them until they are paused)."""
    held: dict[str | None, int] = {}
    for job in active:
        held[job.team] = held.get(job.team, 0) + job.count
    return held


def reclaim_reason(slots: int, team: str | None, job_id: int) -> str:
    """``paused to return 2 slots to team nlp`` (``to job 12`` for a job of no team)."""
    unit = "slot" if slots == 1 else "slots"
    to = f"team {team}" if team is not None else f"job {job_id}"
    return f"paused to return {slots} {unit} to {to}"


@dataclass
class ExecutorQueueing:
    ctx: LoopContext
    starter: RunStarter
    # Submits in flight on their own threads: a slow ``sbatch`` holds neither the loop nor the
    # other jobs.
    submits: Submits = field(init=False)

    def __post_init__(self) -> None:
        self.submits = Submits(wake=self.ctx.queue_changed)

    def run_pass(self, now: float) -> None:
        """Hand every queued job not yet submitted to the executor, highest priority first; the
        answers of earlier submits are stored first. The job stays ``queued`` (the executor's
        queue is the queue) and gets its token now: the token travels with the submission."""
        ctx = self.ctx
        for job_id, future in self.submits.finished():
            self._submitted(job_id, future)
        with ctx.loop_sessions() as session:
            for job in repo.queued_unsubmitted(session):
                if job.id in ctx.watched.refs or self.submits.busy(job.id):
                    continue
                if self.submits.full:
                    break  # the next finished submit wakes the loop for more
                spec = stored_spec(session, job, ctx)
                if spec is None:
                    continue
                token, token_hash = new_token()
                repo.set_token_hash(session, job.id, token_hash)
                session.commit()
                self.submits.start(job.id, partial(
                    self.starter.start_team_run, job.id, token, spec, None, job.params,
                    job.exclude_nodes or (),  # restarted elsewhere: not on these nodes
                    job.team))

    def close(self) -> None:
        self.submits.close()

    def _submitted(self, job_id: int, future: Future[str]) -> None:
        """Store what a submit thread's ``executor.submit`` answered: the reference, or the job
        fails with why (whatever failed, the job must not stay queued)."""
        ctx = self.ctx
        with ctx.loop_sessions() as session:
            try:
                ref = future.result()
            except Exception as exc:
                if not isinstance(exc, ScriptRefused | SecretRefused | OSError | ExecutorError
                                  | ValueError):
                    logger.exception("job %s: submit failed", job_id)
                repo.transition(session, job_id, JobState.failed, reason=f"could not submit: {exc}")
                session.commit()
                logger.info("job %s: could not submit: %s", job_id, exc)
                return
            ctx.watched.refs[job_id] = ref  # a job cancelled meanwhile is stopped by the stops
            repo.set_executor_ref(session, job_id, ctx.executor.name, ref)
            session.commit()
        logger.info("job %s: submitted (%s %s)", job_id, ctx.executor.name, ref)
