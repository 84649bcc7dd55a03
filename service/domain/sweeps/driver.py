"""The sweep driver: makes each running sweep's trials, reports their objective to the search,
prunes them, and ends the sweep. A step of the acting supervisor's loop, under the lease's fence.

The search is an in-memory Optuna study (``service.domain.sweeps.study``) and is never stored:
torchyard's tables are the truth — the sweep's own record of its trials (``sweep_trials``: each
trial's number, parameters and job, and how a trial whose job was deleted ended), the trials' jobs
and their records (each trial's objective per epoch, ``service.domain.sweeps.outcome``). A
supervisor rebuilds each study at the start of its lease term, and after any step that failed, by
replaying the trials in the order they were made — each asked with its recorded parameters, its
objective reported epoch by epoch (the pruner's rung bookkeeping follows), then told how it
ended — so a restart or a failover loses no trial, runs none twice, and pruning goes on. A study
that cannot be rebuilt (a request stored by an older server that this one refuses, a grid over
the bound) fails its sweep with the reason, once: the supervisor goes on, and a failed sweep is
never rebuilt again.

Each step, per running sweep, in one transaction:

1. report each live trial's newly complete epochs; when the pruner says so, the trial is stopped
   like a cancel (state ``cancelled``, ``pruned_epoch``, a reason naming the rule, the epoch and
   the comparison) — it is not a failure; its group is stopped and its slots freed by the loop;
2. tell the search how each trial that ended did (completed with its last epoch's value; pruned;
   failed or cancelled as failed);
3. fail the sweep once ``max_failures`` trials failed (its live trials are cancelled); end it
   once ``max_trials`` trials were made and none is live (succeeded when one completed);
4. make new trials while fewer than ``parallel`` are live — capped, unless the trials are
   preemptible, by how many fit in the team's ``max_slots`` at once. Each trial's job goes through the
   front door of ``POST /jobs`` (``Intake.make``: every check, then the insert). Below the disk
   floor no trial is made until space is freed (the sweep waits); any other refusal fails the
   sweep with the trial's number and the reason (its live trials are cancelled).

The number of trials made is the count of the sweep's record, so deleting trials' jobs never makes
the sweep make more. Creating trials and changing states happen in the transaction that checked
the fence; a step that fails forgets the study, which the next step rebuilds from what was
committed.
"""

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from pydantic import ValidationError
from sqlalchemy.orm import Session, sessionmaker

from service.domain.identity.caller import acting_for
from service.domain.intake.admission import AdmissionRefused
from service.domain.intake.submission import Intake, SubmitRejected
from service.domain.lease import Lease
from service.domain.queue.quota import TeamRules
from service.domain.sweeps.outcome import outcome, trial_epochs
from service.domain.sweeps.spec import SweepSpec
from service.domain.sweeps.study import Study
from service.store import identity as identitystore
from service.store import repository as repo
from service.store import sweeps as store
from service.store.db import is_busy
from service.store.tables import Job, Sweep, SweepTrial
from torchyard_contract.bounds import bounded_text
from torchyard_contract.confinement import PathRefused
from torchyard_contract.state import TERMINAL_STATES, JobState, SweepState, TrialOutcome

logger = logging.getLogger(__name__)
_REFUSED = (SubmitRejected, AdmissionRefused, PathRefused)


class Unbuildable(Exception):
    """A sweep's study cannot be built from its stored request (the message says why)."""


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err.get("loc", ()))
    msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
    return f"{where}: {msg}" if where else msg


class SweepLoop(Protocol):
    """What the driver uses of the loop it is a step of (``service.domain.loop.context``
    provides it; declared here so sweeps do not import the loop that steps them)."""

    loop_sessions: sessionmaker[Session]
    read_sessions: sessionmaker[Session]
    lease: Lease
    queue_changed: Callable[[], None]


@dataclass
class SweepDriver:
    ctx: SweepLoop
    intake: Intake  # the front door of POST /jobs, which every trial goes through
    _studies: dict[int, Study] = field(default_factory=dict)

    def reset(self) -> None:
        """Forget every study (a new lease term rebuilds them from the database)."""
        self._studies.clear()

    def step(self) -> None:
        ctx = self.ctx
        with ctx.read_sessions() as session:
            running = [s.id for s in store.running_sweeps(session)]
            leftovers = store.live_trials_of_ended_sweeps(session)
        changed = False
        if leftovers:
            changed |= self._cancel(leftovers, "its sweep ended")
        for sweep_id in list(self._studies):
            if sweep_id not in running:
                self._studies.pop(sweep_id, None)
        for sweep_id in running:
            try:
                changed |= self._advance(sweep_id)
            except Exception as exc:  # rebuilt from what was committed on the next step
                self._studies.pop(sweep_id, None)
                if not is_busy(exc):
                    logger.exception("sweep %s: step failed", sweep_id)
                else:
                    logger.warning("sweep %s: database busy, retrying: %s", sweep_id,
                                   getattr(exc, "orig", exc))
        if changed:
            ctx.queue_changed()

    def _cancel(self, job_ids: list[int] | Any, reason: str) -> bool:
        with self.ctx.loop_sessions() as session:
            if not self.ctx.lease.fence(session):
                return False
            won = [j for j in job_ids
                   if repo.transition(session, j, JobState.cancelled, reason=reason)]
            session.commit()
        return bool(won)

    def _rebuild(self, sweep: Sweep, records: list[SweepTrial]) -> Study:
        """The sweep's study, every recorded trial asked again with its parameters (in memory
        only). Raises :class:`Unbuildable` or whatever Optuna raised."""
        try:
            spec = SweepSpec.model_validate(sweep.spec)
        except ValidationError as exc:
            raise Unbuildable(f"its request is refused by this server: {_first_error(exc)}") \
                from None
        if (why := spec.grid_refused()) is not None:
            raise Unbuildable(why)
        st = Study.build(spec, len(records))
        for record in records:
            st.ask(record.number, dict(record.params))
        if records:
            logger.info("sweep %s: rebuilt its study from %d trials", sweep.id, len(records))
        return st

    def _advance(self, sweep_id: int) -> bool:
        ctx = self.ctx
        with ctx.loop_sessions() as session:
            if not ctx.lease.fence(session):
                return False
            sweep = store.get_sweep(session, sweep_id)
            if sweep is None or sweep.state != store.RUNNING:
                return False
            records = list(store.trial_records(session, sweep_id))
            jobs = {j.id: j for j in store.trials(session, sweep_id)}
            st = self._studies.get(sweep_id)
            if st is None:
                try:
                    st = self._studies[sweep_id] = self._rebuild(sweep, records)
                except Exception as exc:
                    if is_busy(exc):
                        raise
                    why = f"its study could not be rebuilt: {exc}"
                    self._fail(session, sweep, list(jobs.values()), why)
                    session.commit()
                    return True
            # A trial's job, unless it was deleted (its record holds how it ended).
            trial_jobs = {r.number: jobs.get(r.job_id) if r.state is None else None
                          for r in records}
            changed = self._observe(session, st, records, trial_jobs)
            changed |= self._end_or_grow(session, sweep, st, records, trial_jobs)
            session.commit()
        return changed

    def _observe(self, session: Session, st: Study, records: list[SweepTrial],
                 trial_jobs: dict[int, Job | None]) -> bool:
        pending = [r for r in records if r.number not in st.told]
        for record in pending:
            if trial_jobs[record.number] is None:  # deleted: told from the record
                st.tell(record.number, record.outcome, record.value)
        observed = [(r.number, job) for r in pending if (job := trial_jobs[r.number]) is not None]
        if not observed:
            return False
        after = min(st.last_epoch(number) for number, _ in observed)
        epochs = trial_epochs(session, st.spec.objective, [job for _, job in observed], after)
        changed = False
        for number, job in observed:
            changed |= self._observe_one(session, st, number, job, epochs[job.id])
        return changed

    def _observe_one(self, session: Session, st: Study, number: int, job: Job,
                     epochs: dict[int, float]) -> bool:
        state = JobState(job.state)
        for epoch, value in epochs.items():
            if epoch <= st.last_epoch(number):
                continue
            if not st.report(number, epoch, value):
                continue
            if job.pruned_epoch is None and state not in TERMINAL_STATES:
                reason = st.why_pruned(number, epoch, value)
                if store.prune_trial(session, job.id, epoch, reason):
                    logger.info("sweep %s: job %s %s", job.sweep_id, job.id, reason)
                    st.tell(number, TrialOutcome.pruned)
                    return True
        if state in TERMINAL_STATES:
            end = outcome(job)
            value = st.reported[number][1] if end == TrialOutcome.completed and number in st.reported \
                else None
            st.tell(number, end, value)
        return False

    def _fail(self, session: Session, sweep: Sweep, live: list[Job], why: str) -> None:
        """End the sweep ``failed`` with ``why``; its live trials are cancelled."""
        store.end_sweep(session, sweep.id, SweepState.failed, why)
        for job in live:
            if JobState(job.state) not in TERMINAL_STATES:
                repo.transition(session, job.id, JobState.cancelled,
                                reason=bounded_text(f"sweep failed: {why}"))
        logger.warning("sweep %s: failed: %s", sweep.id, why)

    def _end_or_grow(self, session: Session, sweep: Sweep, st: Study, records: list[SweepTrial],
                     trial_jobs: dict[int, Job | None]) -> bool:
        spec = st.spec
        # (a prune in this transaction updated the jobs in the session: synchronize_session)
        live = [j for j in trial_jobs.values()
                if j is not None and JobState(j.state) not in TERMINAL_STATES]
        ends = [r.outcome if (j := trial_jobs[r.number]) is None else outcome(j) for r in records]
        failed = ends.count(TrialOutcome.failed)
        if spec.max_failures is not None and failed >= spec.max_failures:
            self._fail(session, sweep, live,
                       f"{failed} trials failed (max_failures {spec.max_failures})")
            return True
        made = len(records)
        if made >= spec.trials_total and not live:
            state, why = ((SweepState.succeeded, None) if TrialOutcome.completed in ends
                          else (SweepState.failed, "no trial completed"))
            store.end_sweep(session, sweep.id, state, why)
            logger.info("sweep %s: %s after %d trials", sweep.id, state, made)
            return True
        parallel = self._parallel(session, sweep, spec)
        if made >= spec.trials_total or len(live) >= parallel or self._held(sweep, st):
            return False
        changed = False
        while made < spec.trials_total and len(live) < parallel:
            number = made + 1
            trial = st.ask(number, spec.grid_params(made) if spec.method == "grid" else None)
            params = dict(trial.params)
            try:
                job = self.intake.make(session, spec.trial_spec(sweep.id, number, params),
                                       acting_for(sweep.owner, sweep.team))  # the sweep's
            except ValidationError as exc:
                why = f"trial {number}'s spec is refused: {_first_error(exc)}"
            except _REFUSED as exc:
                if isinstance(exc, SubmitRejected) and exc.status == 507:  # filled meanwhile
                    st.tell(number, TrialOutcome.failed)  # (an ask that made no trial: the next asks anew)
                    st.holding = False  # said by the next step's _held
                    return changed
                why = f"trial {number} is refused as a job: {exc}"
            else:
                store.mark_trial(session, job.id, sweep.id, number, params)
                live.append(job)
                made, changed = number, True
                logger.info("sweep %s: trial %d is job %s with %s", sweep.id, number, job.id,
                            params)
                continue
            st.tell(number, TrialOutcome.failed)
            self._fail(session, sweep, live, why)
            return True
        return changed

    @staticmethod
    def _parallel(session: Session, sweep: Sweep, spec: SweepSpec) -> int:
        """``parallel``, capped by the trials that fit in the team's ``max_slots`` at once
        (at least one), unless the trials are preemptible: those may borrow idle slots."""
        if sweep.team is None or spec.spec.preemptible:
            return spec.parallel
        team = identitystore.get_team(session, sweep.team)
        cap = TeamRules.of(team.name, team.quota, team.share).max_slots if team else None
        if cap is None:
            return spec.parallel
        per_trial = spec.spec.nproc_per_node * spec.spec.nnodes
        return min(spec.parallel, max(1, cap // per_trial))

    def _held(self, sweep: Sweep, st: Study) -> bool:
        """True while the disk floor refuses new jobs: the sweep waits (said once) rather than
        fail for space that a clean-up may free."""
        try:
            self.intake.check_floor()
        except SubmitRejected as exc:
            if not st.holding:
                logger.warning("sweep %s: no new trial until space is freed: %s", sweep.id, exc)
            st.holding = True
            return True
        st.holding = False
        return False
