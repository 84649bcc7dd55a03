"""Chart series from metric points: one line per (rank, attempt), a cross-rank mean, downsampled.

Pure functions (no SQL, no HTTP). Downsampling is M4 from ``tsdownsample``: the series is cut into
buckets and each bucket keeps its first, last, smallest and largest point, so the first and last
point of the whole series and its extremes (a loss spike, a NaN) are always kept and a line drawn
through the kept points looks like the line through all of them.
"""

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from tsdownsample import NaNM4Downsampler

MIN_POINTS = 16  # M4 keeps 4 points per bucket and needs a few buckets to be meaningful


@dataclass(frozen=True)
class Line:
    rank: int | None  # None for the cross-rank mean
    attempt: int | None
    x: list[int]
    y: list[float]
    points: int  # before downsampling


def downsample_indices(values: Sequence[float] | np.ndarray, max_points: int) -> list[int]:
    """Indices of the points to keep, ascending: all of them when there are at most ``max_points``.

    Otherwise at most ``max_points`` (rounded down to a multiple of 4, at least ``MIN_POINTS``);
    the first and last index, the smallest and largest finite value and, in each bucket that has
    one, a NaN are kept.
    """
    n = len(values)
    n_out = max(MIN_POINTS, max_points - max_points % 4)
    if n <= n_out:
        return list(range(n))
    y = np.asarray(values, dtype=np.float64)
    # NaN-aware M4 keeps a bucket's NaN; ±inf compare as ordinary extremes and are kept too.
    kept = NaNM4Downsampler().downsample(y, n_out=n_out)
    return sorted({0, n - 1, *(int(i) for i in kept)})


def epoch_mean(
    attempt: np.ndarray, rank: np.ndarray, x: np.ndarray, value: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Mean across ranks at each x. Where attempts overlap (a restart resumed from a checkpoint
    before the epoch the last attempt reached) only the latest attempt's value of a rank counts.
    A NaN or inf of any rank makes that x's mean NaN or inf: a diverged rank shows in the mean."""
    if not len(x):
        return x, value
    order = np.lexsort((attempt, rank, x))  # by x, then rank, then attempt
    xs, rs, vs = x[order], rank[order], value[order]
    # The last row of each (x, rank) run is its latest attempt.
    last = np.ones(len(xs), dtype=bool)
    last[:-1] = (xs[1:] != xs[:-1]) | (rs[1:] != rs[:-1])
    xs, vs = xs[last], vs[last]
    starts = np.flatnonzero(np.r_[True, xs[1:] != xs[:-1]])
    counts = np.diff(np.r_[starts, len(xs)])
    return xs[starts], np.add.reduceat(vs, starts) / counts


def _line(rank: int | None, attempt: int | None, x: np.ndarray, y: np.ndarray, max_points: int
          ) -> Line:
    keep = downsample_indices(y, max_points)
    return Line(rank, attempt, x[keep].tolist(), y[keep].tolist(), len(y))


def build_lines(
    attempt: Sequence[int], rank: Sequence[int], x: Sequence[int], value: Sequence[float],
    max_points: int,
) -> tuple[list[Line], Line]:
    """One downsampled line per (rank, attempt), ordered by rank then attempt, and the mean line.

    The four columns describe one point per index, in any order; each line is sorted by x.
    """
    a = np.asarray(attempt, dtype=np.int64)
    r = np.asarray(rank, dtype=np.int64)
    xs = np.asarray(x, dtype=np.int64)
    v = np.asarray(value, dtype=np.float64)
    order = np.lexsort((xs, a, r))  # by rank, then attempt, then x
    a_o, r_o, x_o, v_o = a[order], r[order], xs[order], v[order]
    bounds = np.flatnonzero((a_o[1:] != a_o[:-1]) | (r_o[1:] != r_o[:-1])) + 1
    lines = [
        _line(int(r_o[lo]), int(a_o[lo]), x_o[lo:hi], v_o[lo:hi], max_points)
        for lo, hi in zip(np.r_[0, bounds], np.r_[bounds, len(x_o)], strict=True)
        if hi > lo
    ]
    mean_x, mean_y = epoch_mean(a, r, xs, v)
    return lines, _line(None, None, mean_x, mean_y, max_points)
