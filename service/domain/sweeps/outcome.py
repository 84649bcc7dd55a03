"""What a trial scored: its objective per epoch reduced across ranks, how it ended, its value.

The objective of a trial at an epoch is its ranks' values of ``objective.metric`` at that epoch
reduced into one (``objective.reduce``, mean by default), counted only once every rank reported
it: a trial whose ranks disagree is judged on what all of them said, never on rank 0 alone. The
sweep's driver (``driver``), its reads and its record of a deleted trial (``manage``) all score a
trial here.
"""

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence

from sqlalchemy.orm import Session

from service.domain.sweeps.spec import Objective
from service.store import sweeps as store
from service.store.tables import Job
from torchyard_contract.attempts import spec_world_size
from torchyard_contract.state import TERMINAL_STATES, JobState, TrialOutcome

REDUCE: dict[str, Callable[[list[float]], float]] = {
    "mean": lambda values: math.fsum(values) / len(values),
    "min": min,
    "max": max,
}
Rows = Iterable[tuple[int, int, int, float]]  # (attempt, rank, epoch, value) of one trial


def reduced_epochs(rows: Rows, ranks: int, reduce: str) -> dict[int, float]:
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


def outcome(job: Job) -> TrialOutcome | None:
    """``completed``, ``pruned``, ``failed`` or ``cancelled``; None while queued or running."""
    state = JobState(job.state)
    if state not in TERMINAL_STATES:
        return None
    if job.pruned_epoch is not None:
        return TrialOutcome.pruned
    return {JobState.succeeded: TrialOutcome.completed,
            JobState.failed: TrialOutcome.failed}.get(state, TrialOutcome.cancelled)


def final_value(job: Job, epochs: dict[int, float]) -> float | None:
    """A completed trial's value: its objective at its last complete epoch."""
    if not epochs or outcome(job) != "completed":
        return None
    return epochs[max(epochs)]


def trial_epochs(
    session: Session, objective: Objective, jobs: Sequence[Job], after_epoch: int = 0
) -> dict[int, dict[int, float]]:
    """Job id → its objective per complete epoch after ``after_epoch`` (a pruned trial's only up
    to the epoch it was pruned at), from every rank's stored records."""
    rows: dict[int, list[tuple[int, int, int, float]]] = defaultdict(list)
    for job_id, attempt, rank, epoch, value in store.epoch_values(
        session, [j.id for j in jobs], objective.metric, after_epoch
    ):
        rows[job_id].append((attempt, rank, epoch, value))
    out = {}
    for job in jobs:
        epochs = reduced_epochs(rows[job.id], spec_world_size(job.spec), objective.reduce)
        if job.pruned_epoch is not None:
            epochs = {e: v for e, v in epochs.items() if e <= job.pruned_epoch}
        out[job.id] = epochs
    return out
