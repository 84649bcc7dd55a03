"""Cross-rank statistics of one per-epoch metric, and the rule that flags a diverging rank.

Pure functions over plain values (no SQL, no HTTP), so the rule is unit-testable.

Divergence rule, per epoch (``threshold`` is a relative distance, e.g. 0.5 = 50 %):

* The reference is the *lower median* of the ranks' finite values (``statistics.median_low``):
  with three or more ranks a single outlier cannot move it; with two ranks that disagree it is
  the smaller value, so the rank with the larger value is the one flagged (for a loss: the rank
  whose loss went up).
* A finite value ``v`` diverges when ``|v - ref| > threshold * max(|ref|, REL_FLOOR)``.
* A non-finite value (NaN, ±Inf) diverges when at least one rank has a finite value.
* One rank alone never diverges; nor do ranks that are all non-finite.
"""

import math
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

# The relative distance that flags a rank unless the caller asks for another (0.5 = 50 %).
DEFAULT_THRESHOLD = 0.5
# Keeps the relative distance defined when the reference is 0 (e.g. an accuracy of 0).
REL_FLOOR = 1e-8


@dataclass(frozen=True)
class EpochValue:
    attempt: int
    rank: int
    epoch: int
    value: float  # may be NaN or ±Inf


@dataclass(frozen=True)
class EpochSummary:
    """One epoch across ranks. Statistics cover the finite values only (None when there are none);
    ``std`` is the population standard deviation; ``count`` is the number of ranks reporting."""

    epoch: int
    attempt: int
    count: int
    mean: float | None
    min: float | None
    max: float | None
    std: float | None
    ranks: dict[int, float]
    diverged_ranks: list[int]


def diverged_ranks(values: dict[int, float], threshold: float) -> list[int]:
    """Ranks whose value breaks the module's divergence rule, ascending."""
    finite = [v for v in values.values() if math.isfinite(v)]
    if len(values) < 2 or not finite:
        return []
    ref = statistics.median_low(finite)
    tolerance = threshold * max(abs(ref), REL_FLOOR)
    return sorted(
        rank for rank, v in values.items() if not math.isfinite(v) or abs(v - ref) > tolerance
    )


def summarize(values: Iterable[EpochValue], threshold: float) -> list[EpochSummary]:
    """Per epoch, ascending. Each epoch uses the latest attempt that reported it, so a job that
    restarted and resumed still has one row per epoch, with all its ranks from one attempt."""
    by_epoch: dict[int, dict[int, dict[int, float]]] = defaultdict(lambda: defaultdict(dict))
    for v in values:
        by_epoch[v.epoch][v.attempt][v.rank] = v.value
    out = []
    for epoch in sorted(by_epoch):
        attempt = max(by_epoch[epoch])
        ranks = dict(sorted(by_epoch[epoch][attempt].items()))
        finite = [v for v in ranks.values() if math.isfinite(v)]
        out.append(
            EpochSummary(
                epoch=epoch,
                attempt=attempt,
                count=len(ranks),
                mean=_overflow_safe(statistics.fmean, finite),
                min=min(finite) if finite else None,
                max=max(finite) if finite else None,
                std=_overflow_safe(statistics.pstdev, finite),
                ranks=ranks,
                diverged_ranks=diverged_ranks(ranks, threshold),
            )
        )
    return out


def _overflow_safe(stat: Callable[[list[float]], float], values: list[float]) -> float | None:
    """``stat(values)``; None for no values, infinity (JSON null) where values near 1e308 overflow."""
    if not values:
        return None
    try:
        return stat(values)
    except OverflowError:
        return math.inf
