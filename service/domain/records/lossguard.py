"""Loss guards: stop a job whose loss went non-finite, or whose ranks diverged, for too long.

Spec fields ``nonfinite_patience`` (default 1) and ``divergence_patience`` (default off). Only
per-epoch records named ``loss`` (``step`` null) count, from any rank, built-in trainer or
script; "in a row" means consecutive epoch numbers of one attempt.

* Non-finite: one rank's loss is NaN or ±Inf for ``nonfinite_patience`` consecutive epochs.
* Divergence: the cross-rank rule of :mod:`service.domain.records.summary` (default threshold) flags the
  same rank for ``divergence_patience`` consecutive epochs; an epoch counts only once every rank
  reported it, so a verdict never rests on half an epoch.

Two halves, so any number of API processes can ingest: :func:`check` runs in the transaction
that stored a batch (the records route, and the supervisor's spool re-ingestion at the end of a
job) and, when a guard trips, notes the reason in ``jobs.stop_reason`` — compare-and-set, so the
first offending record wins and later ones change nothing. The supervisor, the one owner of state
changes, then fails the job with that reason and stops its group like a cancel. The records stay
stored: they are data.
"""

import math
from collections import defaultdict
from collections.abc import Sequence

from sqlalchemy.orm import Session

from service.domain.records.summary import DEFAULT_THRESHOLD, diverged_ranks
from service.store import records as recordstore
from service.store import repository as repo
from torchyard_contract.records import nonfinite_name
from torchyard_contract.spec import JobSpec

LOSS = "loss"


def _fmt(value: float) -> str:
    return nonfinite_name(value) or f"{value:.6g}"


def nonfinite_reason(rank: int, epoch: int, value: float, patience: int) -> str:
    """The job's reason: names the rank, the epoch the guard tripped at and the value."""
    reason = f"rank {rank} reported loss {_fmt(value)} at epoch {epoch}"
    if patience > 1:
        reason += f" (non-finite {patience} epochs in a row)"
    return reason


def nonfinite_trip(values: dict[int, float], patience: int) -> int | None:
    """The first epoch ending ``patience`` consecutive non-finite values (epoch → value of one
    rank in one attempt), or None."""
    run, last = 0, None
    for epoch in sorted(values):
        if math.isfinite(values[epoch]):
            run = 0
        else:
            run = run + 1 if last == epoch - 1 and run else 1
            if run >= patience:
                return epoch
        last = epoch
    return None


def divergence_trip(
    by_epoch: dict[int, dict[int, float]], world_size: int, patience: int
) -> tuple[int, int] | None:
    """``(rank, epoch)``: the first epoch ending ``patience`` consecutive complete epochs (every
    rank reported) in which that rank was flagged; None when there is none."""
    streak: dict[int, int] = {}
    last = None
    for epoch in sorted(by_epoch):
        ranks = by_epoch[epoch]
        if len(ranks) < world_size:
            streak, last = {}, None  # an incomplete epoch breaks every streak
            continue
        flagged = set(diverged_ranks(ranks, DEFAULT_THRESHOLD))
        contiguous = last == epoch - 1
        streak = {r: (streak.get(r, 0) if contiguous else 0) + 1 for r in flagged}
        last = epoch
        tripped = sorted(r for r, n in streak.items() if n >= patience)
        if tripped:
            return tripped[0], epoch
    return None


def check(session: Session, job_id: int, spec: dict, records: Sequence[recordstore.RecordIn]) -> str | None:
    """Run the job's guards over a batch just stored in ``session``'s transaction; when one trips,
    note its reason (compare-and-set, see the module doc). Returns the reason noted now, if any.

    Reads only around the epochs of the batch's ``loss`` records; a batch without any costs
    nothing. The caller commits."""
    losses = [r for r in records if r.name == LOSS and r.step is None and r.epoch is not None]
    if not losses:
        return None
    parsed = JobSpec.model_validate(spec)
    reason = None
    if parsed.nonfinite_patience is not None:
        reason = _check_nonfinite(session, job_id, losses, parsed.nonfinite_patience)
    if reason is None and parsed.divergence_patience is not None:
        reason = _check_divergence(
            session, job_id, losses, parsed.divergence_patience, parsed.nproc_per_node
        )
    if reason is not None and repo.request_stop(session, job_id, reason):
        return reason
    return None


def _check_nonfinite(
    session: Session, job_id: int, losses: Sequence[recordstore.RecordIn], patience: int
) -> str | None:
    bad = [r for r in losses if not math.isfinite(r.value)]
    if not bad:
        return None
    if patience == 1:
        first = min(bad, key=lambda r: (r.attempt, r.epoch, r.rank))
        return nonfinite_reason(first.rank, first.epoch or 0, first.value, 1)
    for attempt, rank in sorted({(r.attempt, r.rank) for r in bad}):
        epochs = [r.epoch or 0 for r in bad if (r.attempt, r.rank) == (attempt, rank)]
        rows = recordstore.epoch_losses(
            session, job_id, attempt, min(epochs) - patience + 1, max(epochs) + patience - 1, rank
        )
        values = {epoch: value for _rank, epoch, value in rows}
        tripped = nonfinite_trip(values, patience)
        if tripped is not None:
            return nonfinite_reason(rank, tripped, values[tripped], patience)
    return None


def _check_divergence(
    session: Session, job_id: int, losses: Sequence[recordstore.RecordIn], patience: int,
    world_size: int,
) -> str | None:
    if world_size < 2:
        return None
    touched: dict[int, list[int]] = defaultdict(list)
    for r in losses:
        touched[r.attempt].append(r.epoch or 0)
    for attempt, epochs in sorted(touched.items()):
        rows = recordstore.epoch_losses(
            session, job_id, attempt, min(epochs) - patience + 1, max(epochs) + patience - 1
        )
        by_epoch: dict[int, dict[int, float]] = defaultdict(dict)
        for rank, epoch, value in rows:
            by_epoch[epoch][rank] = value
        tripped = divergence_trip(by_epoch, world_size, patience)
        if tripped is not None:
            rank, epoch = tripped
            ranks = by_epoch[epoch]
            return (
                f"rank {rank} diverged from the other ranks' loss {patience} epochs in a row "
                f"(epoch {epoch}: {_fmt(ranks[rank])}; ranks: "
                + ", ".join(f"{r}={_fmt(v)}" for r, v in sorted(ranks.items())) + ")"
            )
    return None
