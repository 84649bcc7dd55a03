"""The sweep driver: makes each running sweep's trials, reports their objective to the search,
prunes them, and ends the sweep. A step of the acting supervisor's loop, under the lease's fence.

The search and the early stopping are Optuna's (samplers: ``GridSampler``, ``RandomSampler``,
``TPESampler``; pruners: ``SuccessiveHalvingPruner`` for ASHA, ``MedianPruner``) through its
ask-and-tell interface, on an in-memory study. The study is never stored: torchyard's own tables
are the truth (a trial is a job with ``sweep_id`` and ``params``; its objective per epoch is read
from every rank's records, ``service.domain.sweeps.manage.reduced_epochs``). A supervisor rebuilds each
study at the start of its lease term, and after any step that failed, by replaying the trials in
the order they were made — each asked with its stored parameters, its objective reported epoch by
epoch (the pruner's rung bookkeeping follows), then told how it ended — so a restart or a
failover loses no trial, runs none twice, and pruning goes on. A rebuilt sampler is seeded with
``seed + trials made so far``, so it does not draw again what the first term drew.

Each step, per running sweep, in one transaction:

1. report each live trial's newly complete epochs; when the pruner says so, the trial is stopped
   like a cancel (state ``cancelled``, ``pruned_epoch``, a reason naming the rule, the epoch and
   the comparison) — it is not a failure; its group is stopped and its slots freed by the loop;
2. tell the search how each trial that ended did (completed with its last epoch's value; pruned;
   failed or cancelled as failed);
3. fail the sweep once ``max_failures`` trials failed (its live trials are cancelled); end it
   once ``max_trials`` trials were made and none is live (succeeded when one completed);
4. make new trials (jobs with the sweep's priority) while fewer than ``parallel`` are live.

Creating trials and changing states happen in the transaction that checked the fence; a step
that fails forgets the study, which the next step rebuilds from what was committed.
"""

import logging
import math
import statistics
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from pydantic import ValidationError
from sqlalchemy.orm import Session, sessionmaker

from service.domain.lease import Lease
from service.domain.sweeps.manage import outcome, reduced_epochs, world_size
from service.domain.sweeps.spec import (
    AshaRule,
    ChoiceDim,
    IntDim,
    LogUniformDim,
    MedianRule,
    SweepSpec,
    grid_points,
    grid_values,
)
from service.domain.tracking import enrolment as tracking
from service.settings import Settings
from service.settings import webhookfile as webhookconf
from service.store import repository as repo
from service.store import sweeps as store
from service.store.db import is_busy
from service.store.tables import Job, Sweep
from torchyard_contract.state import TERMINAL_STATES, JobState

logger = logging.getLogger(__name__)


def _optuna() -> Any:
    """Optuna, imported on first use (a server with no sweep never pays for it)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def distributions(spec: SweepSpec) -> dict[str, Any]:
    d = _optuna().distributions
    out: dict[str, Any] = {}
    for name, dim in spec.space.items():
        if isinstance(dim, ChoiceDim):
            out[name] = d.CategoricalDistribution(dim.values)
        elif isinstance(dim, IntDim):
            out[name] = d.IntDistribution(dim.low, dim.high, step=dim.step, log=dim.log)
        else:
            out[name] = d.FloatDistribution(dim.low, dim.high, log=isinstance(dim, LogUniformDim))
    return out


def grid_space(spec: SweepSpec) -> dict[str, list]:
    return {k: grid_values(spec.space[k]) for k in sorted(spec.space)}  # type: ignore[arg-type]


def make_sampler(spec: SweepSpec, made: int) -> Any:
    samplers = _optuna().samplers
    seed = spec.seed + made
    if spec.method == "grid":

        class _Grid(samplers.GridSampler):
            # Optuna's GridSampler calls study.stop() once the grid is covered, which only an
            # optimize() loop allows; the driver stops at max_trials (at most the grid's size).
            def after_trial(self, *args: Any, **kwargs: Any) -> None:
                return None

        return _Grid(grid_space(spec), seed=seed)
    if spec.method == "tpe":
        return samplers.TPESampler(seed=seed)
    return samplers.RandomSampler(seed=seed)


def make_pruner(spec: SweepSpec) -> Any:
    pruners = _optuna().pruners
    rule = spec.prune
    if isinstance(rule, AshaRule):
        return pruners.SuccessiveHalvingPruner(
            min_resource=rule.min_epochs, reduction_factor=rule.reduction_factor,
            min_early_stopping_rate=0)
    if isinstance(rule, MedianRule):
        return pruners.MedianPruner(
            n_startup_trials=rule.startup_trials, n_warmup_steps=rule.warmup_epochs)
    return pruners.NopPruner()


def _fmt(value: float) -> str:
    return f"{value:.4g}"


@dataclass
class _Study:
    """One sweep's search in this term: the Optuna study and which trials it knows."""

    spec: SweepSpec
    study: Any
    dists: dict[str, Any]
    trials: dict[int, Any] = field(default_factory=dict)  # job id → live Optuna trial
    reported: dict[int, int] = field(default_factory=dict)  # job id → last epoch reported
    told: set[int] = field(default_factory=set)  # job ids whose end the study was told

    def adopt(self, job: Job) -> None:
        """Ask the study for a trial with the job's stored parameters (a rebuild)."""
        self.study.enqueue_trial(dict(job.params or {}))
        trial = self.study.ask(self.dists)
        if self.spec.method == "grid":  # GridSampler knows a point as visited by its grid id
            names = sorted(self.spec.space)
            point = tuple((job.params or {}).get(n) for n in names)
            points = grid_points(self.spec.space)
            if point in points:
                storage = self.study._storage  # Optuna has no public setter of system attrs
                storage.set_trial_system_attr(trial._trial_id, "search_space",
                                              grid_space(self.spec))
                storage.set_trial_system_attr(trial._trial_id, "grid_id", points.index(point))
        self.trials[job.id] = trial

    def why_pruned(self, trial: Any, epoch: int, value: float) -> str:
        """The rule, the epoch and the comparison that pruned ``trial``."""
        metric, mode = self.spec.objective.metric, self.spec.objective.mode
        worse = ">" if mode == "min" else "<"
        if not math.isfinite(value):
            return f"pruned at epoch {epoch}: {metric} is {value}"
        others = self.study.get_trials(deepcopy=False)
        rule = self.spec.prune
        if isinstance(rule, AshaRule):
            attrs = trial.storage.get_trial_system_attrs(trial._trial_id)
            rungs = [int(k.rsplit("_", 1)[1]) for k in attrs if k.startswith("completed_rung_")]
            rung = max(rungs, default=0)
            key = f"completed_rung_{rung}"
            values = sorted(t.system_attrs[key] for t in others if key in t.system_attrs
                            and t.number != trial.number) + [value]
            values.sort(reverse=mode == "max")
            cutoff = values[max(len(values) // rule.reduction_factor - 1, 0)]
            return (f"pruned by ASHA at epoch {epoch}: {metric} {_fmt(value)} {worse} rung "
                    f"{rung} cutoff {_fmt(cutoff)} (the best 1/{rule.reduction_factor} of "
                    f"{len(values)} trials go on)")
        at = [t.intermediate_values[epoch] for t in others if t.number != trial.number
              and t.state.is_finished() and epoch in t.intermediate_values]
        median = statistics.median(at) if at else float("nan")
        return (f"pruned by the median rule at epoch {epoch}: {metric} {_fmt(value)} {worse} "
                f"median {_fmt(median)} of {len(at)} trials at that epoch")


class SweepLoop(Protocol):
    """What the driver uses of the loop it is a step of (``service.domain.loop.context``
    provides it; declared here so sweeps do not import the loop that steps them)."""

    settings: Settings
    loop_sessions: sessionmaker[Session]
    read_sessions: sessionmaker[Session]
    lease: Lease
    queue_changed: Callable[[], None]


@dataclass
class SweepDriver:
    ctx: SweepLoop
    _studies: dict[int, _Study] = field(default_factory=dict)

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

    def _study(self, sweep: Sweep, jobs: list[Job]) -> _Study:
        st = self._studies.get(sweep.id)
        if st is not None:
            return st
        spec = SweepSpec.model_validate(sweep.spec)
        optuna = _optuna()
        study = optuna.create_study(
            direction="minimize" if spec.objective.mode == "min" else "maximize",
            sampler=make_sampler(spec, len(jobs)), pruner=make_pruner(spec),
        )
        st = _Study(spec=spec, study=study, dists=distributions(spec))
        self._studies[sweep.id] = st
        if jobs:
            logger.info("sweep %s: rebuilding its study from %d trials", sweep.id, len(jobs))
        return st

    def _advance(self, sweep_id: int) -> bool:
        ctx = self.ctx
        with ctx.loop_sessions() as session:
            if not ctx.lease.fence(session):
                return False
            sweep = store.get_sweep(session, sweep_id)
            if sweep is None or sweep.state != store.RUNNING:
                return False
            jobs = list(store.trials(session, sweep_id))
            st = self._study(sweep, jobs)
            for job in jobs:
                if job.id not in st.trials and job.id not in st.told:
                    st.adopt(job)
            changed = self._observe(session, st, [j for j in jobs if j.id not in st.told])
            changed |= self._end_or_grow(session, sweep, st, jobs)
            session.commit()
        return changed

    def _observe(self, session: Session, st: _Study, jobs: list[Job]) -> bool:
        if not jobs:
            return False
        objective = st.spec.objective
        after = min(st.reported.get(j.id, 0) for j in jobs)
        rows: dict[int, list] = defaultdict(list)
        for job_id, attempt, rank, epoch, value in store.epoch_values(
            session, [j.id for j in jobs], objective.metric, after
        ):
            rows[job_id].append((attempt, rank, epoch, value))
        changed = False
        for job in jobs:
            epochs = reduced_epochs(rows[job.id], world_size(job.spec), objective.reduce)
            changed |= self._observe_one(session, st, job, epochs)
        return changed

    def _observe_one(self, session: Session, st: _Study, job: Job, epochs: dict) -> bool:
        trial = st.trials[job.id]
        state = JobState(job.state)
        last = st.reported.get(job.id, 0)
        for epoch, value in epochs.items():
            if epoch <= last:
                continue
            if job.pruned_epoch is not None and epoch > job.pruned_epoch:
                break
            trial.report(value, epoch)
            st.reported[job.id] = last = epoch
            if st.spec.prune is None or not trial.should_prune():
                continue
            if job.pruned_epoch is None and state not in TERMINAL_STATES:
                reason = st.why_pruned(trial, epoch, value)
                if store.prune_trial(session, job.id, epoch, reason):
                    logger.info("sweep %s: job %s %s", job.sweep_id, job.id, reason)
                    self._tell(st, job.id, "pruned")
                    return True
        if state in TERMINAL_STATES:
            end = outcome(job)
            value = epochs.get(last) if end == "completed" and last else None
            self._tell(st, job.id, end if value is None or end != "completed" else "completed",
                       value)
        return False

    def _tell(self, st: _Study, job_id: int, end: str | None, value: float | None = None) -> None:
        states = _optuna().trial.TrialState
        trial = st.trials.pop(job_id)
        if end == "completed" and value is not None and math.isfinite(value):
            st.study.tell(trial, value)
        elif end == "pruned":
            st.study.tell(trial, state=states.PRUNED)
        else:
            st.study.tell(trial, state=states.FAIL)
        st.told.add(job_id)

    def _end_or_grow(self, session: Session, sweep: Sweep, st: _Study, jobs: list[Job]) -> bool:
        spec = st.spec
        # (a prune in this transaction updated the jobs in the session: synchronize_session)
        live = [j for j in jobs if JobState(j.state) not in TERMINAL_STATES]
        failed = sum(1 for j in jobs if outcome(j) == "failed")
        if spec.max_failures is not None and failed >= spec.max_failures:
            why = f"{failed} trials failed (max_failures {spec.max_failures})"
            store.end_sweep(session, sweep.id, "failed", why)
            for job in live:
                repo.transition(session, job.id, JobState.cancelled, reason=f"sweep failed: {why}")
            logger.info("sweep %s: failed: %s", sweep.id, why)
            return True
        made = len(jobs)
        if made >= spec.trials_total and not live:
            completed = [j for j in jobs if outcome(j) == "completed"]
            state, why = ("succeeded", None) if completed else ("failed", "no trial completed")
            store.end_sweep(session, sweep.id, state, why)
            logger.info("sweep %s: %s after %d trials", sweep.id, state, made)
            return True
        changed = False
        while made < spec.trials_total and len(live) < spec.parallel:
            trial = st.study.ask(st.dists)
            params = dict(trial.params)
            try:
                job_spec = spec.trial_spec(sweep.id, made + 1, params)
            except ValidationError as exc:
                st.study.tell(trial, state=_optuna().trial.TrialState.FAIL)
                store.end_sweep(session, sweep.id, "failed",
                                f"trial {made + 1}'s spec is refused: {exc.errors()[0]['msg']}")
                return True
            # A trial is told of like any job (the base spec's ``notify``, every all-jobs endpoint).
            try:
                webhooks = webhookconf.subscriptions(job_spec.notify, self.ctx.settings.webhooks_file)
            except webhookconf.NotifyRefused:
                webhooks = None  # an endpoint since removed from the file: the trial runs untold
            job = repo.create_job(session, job_spec, webhooks=webhooks)
            store.mark_trial(session, job.id, sweep.id, params)
            tracking.enrol_job(session, self.ctx.settings, job, job_spec)
            st.trials[job.id] = trial
            live.append(job)
            made += 1
            changed = True
            logger.info("sweep %s: trial %d is job %s with %s", sweep.id, made, job.id, params)
        return changed
