"""Sweeps as the routes see them: create (checked like a job submission), cancel, and read
(trials with their outcome and objective per epoch, counts, the best trial).

Creating a sweep stores its request and wakes the supervisor; the trials are made by the sweep
driver (``service.domain.sweeps.driver``) in the acting supervisor, never here. The objective of a
trial at an epoch is its ranks' values of ``objective.metric`` at that epoch reduced into one
(``objective.reduce``, mean by default), counted only once every rank reported it: a trial whose
ranks disagree is judged on what all of them said, never on rank 0 alone.
"""

import math
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from sqlalchemy.orm import Session, sessionmaker

from service.domain.intake.admission import admit
from service.domain.intake.submission import Intake
from service.domain.sweeps.spec import SweepSpec, extremes
from service.domain.tracking import enrolment as tracking
from service.store import repository as repo
from service.store import sweeps as store
from service.store.tables import Job, Sweep
from torchyard_contract.spec import JobSpec
from torchyard_contract.state import TERMINAL_STATES, JobState

REDUCE: dict[str, Callable[[list[float]], float]] = {
    "mean": lambda values: math.fsum(values) / len(values),
    "min": min,
    "max": max,
}


def world_size(spec: dict) -> int:
    return int(spec.get("nproc_per_node", 1)) * int(spec.get("nnodes", 1))


def reduced_epochs(
    rows: Iterable[tuple[int, int, int, float]], ranks: int, reduce: str
) -> dict[int, float]:
    """epoch → the reduced value, from ``(attempt, rank, epoch, value)`` rows of one trial: per
    epoch, the latest attempt in which every one of ``ranks`` reported it; incomplete epochs
    are left out."""
    by: dict[tuple[int, int], dict[int, float]] = defaultdict(dict)
    for attempt, rank, epoch, value in rows:
        by[(epoch, attempt)][rank] = value
    out: dict[int, float] = {}
    for (epoch, _attempt), values in sorted(by.items()):  # later attempts overwrite
        if len(values) >= ranks:
            out[epoch] = REDUCE[reduce](list(values.values()))
    return dict(sorted(out.items()))


def outcome(job: Job) -> str | None:
    """``completed``, ``pruned``, ``failed`` or ``cancelled``; None while queued or running."""
    state = JobState(job.state)
    if state not in TERMINAL_STATES:
        return None
    if job.pruned_epoch is not None:
        return "pruned"
    return {JobState.succeeded: "completed", JobState.failed: "failed"}.get(state, "cancelled")


@dataclass(frozen=True)
class TrialView:
    job_id: int
    params: dict
    state: str
    outcome: str | None
    value: float | None
    epochs: dict[int, float]
    reason: str | None


@dataclass(frozen=True)
class SweepView:
    sweep: Sweep
    trials: list[TrialView]

    @property
    def counts(self) -> dict[str, int]:
        counts = {"queued": 0, "running": 0, "completed": 0, "pruned": 0, "failed": 0,
                  "cancelled": 0}
        for t in self.trials:
            key = t.outcome or ("queued" if t.state == JobState.queued.value else "running")
            counts[key] += 1
        return counts

    @property
    def best(self) -> TrialView | None:
        spec = SweepSpec.model_validate(self.sweep.spec)
        done = [t for t in self.trials
                if t.outcome == "completed" and t.value is not None and math.isfinite(t.value)]
        if not done:
            return None
        pick = min if spec.objective.mode == "min" else max
        return pick(done, key=lambda t: t.value)  # type: ignore[arg-type,return-value]


def final_value(job: Job, epochs: dict[int, float]) -> float | None:
    """A completed trial's value: its objective at its last complete epoch."""
    if not epochs or outcome(job) != "completed":
        return None
    return epochs[max(epochs)]


def view(session: Session, sweep: Sweep) -> SweepView:
    spec = SweepSpec.model_validate(sweep.spec)
    jobs = store.trials(session, sweep.id)
    rows: dict[int, list[tuple[int, int, int, float]]] = defaultdict(list)
    for job_id, attempt, rank, epoch, value in store.epoch_values(
        session, [j.id for j in jobs], spec.objective.metric
    ):
        rows[job_id].append((attempt, rank, epoch, value))
    trials = []
    for job in jobs:
        epochs = reduced_epochs(rows[job.id], world_size(job.spec), spec.objective.reduce)
        if job.pruned_epoch is not None:
            epochs = {e: v for e, v in epochs.items() if e <= job.pruned_epoch}
        trials.append(TrialView(
            job_id=job.id, params=dict(job.params or {}), state=job.state, outcome=outcome(job),
            value=final_value(job, epochs), epochs=epochs, reason=job.reason,
        ))
    return SweepView(sweep, trials)


class SweepRejected(Exception):
    """A sweep valid on its own that this server cannot run (``kind``, ``status`` as for
    ``service.domain.intake.submission.SubmitRejected``)."""

    def __init__(self, kind: str, message: str, status: int = 422) -> None:
        super().__init__(message)
        self.kind, self.status = kind, status


@dataclass
class Sweeps:
    sessions: sessionmaker[Session]
    intake: Intake
    changed: Callable[[], None]  # wakes the supervisor's loop

    def create(self, spec: SweepSpec) -> Sweep:
        """Store a running sweep; raises what a job submission of its trials would
        (``SubmitRejected``, ``AdmissionRefused``, ``PathRefused``)."""
        base = admit(spec.spec, self.intake.settings)
        spec = spec.model_copy(update={"spec": base})
        self.intake.check_runnable(base)
        for key, dim in spec.space.items():  # every spec field the space sets, at its bounds
            if spec.sets_field(key):
                for value in extremes(dim):
                    self.intake.check_runnable(
                        JobSpec.model_validate({**base.model_dump(mode="json"), key: value}))
        with self.sessions() as session:
            sweep = store.create_sweep(
                session, spec.name, spec.spec.priority, spec.model_dump(mode="json"))
            tracking.enrol_sweep(session, self.intake.settings, sweep, spec.spec)
            session.commit()
            session.refresh(sweep)
        self.changed()
        return sweep

    def cancel(self, sweep_id: int) -> Sweep | None:
        """running → cancelled, and its queued and running trials with it (the supervisor stops
        their groups). A sweep already ended is returned unchanged; None if there is none."""
        with self.sessions() as session:
            if store.get_sweep(session, sweep_id) is None:
                return None
            store.end_sweep(session, sweep_id, "cancelled", "cancelled by user")
            for job in store.trials(session, sweep_id):
                repo.transition(session, job.id, JobState.cancelled,
                                reason=f"sweep {sweep_id} cancelled")
            session.commit()
            sweep = store.get_sweep(session, sweep_id)
        self.changed()
        return sweep
