"""A grid sweep's points, never materialised: the grid's size by arithmetic, the point at an index
by mixed radix, and the order trials visit the points in as a permutation computed per index.

A grid of ``choice`` and ``int`` dimensions has ``∏ len(values)`` points (an ``int`` dimension
``(high - low) // step + 1``); the point at index ``i`` takes, for each dimension in sorted name
order, the digit of ``i`` in the mixed radix of the dimensions' sizes (the last name varies
fastest). Trial ``k`` (0-based, counting every trial the sweep made) gets the point at index
``(a·k + b) mod size``, an affine permutation whose ``a`` (coprime with the size) and ``b`` are
drawn from the sweep's seed: every point once, in a shuffled order, each computed in
O(dimensions) whatever the grid's size, and the same after a restart (the count of trials made is
the sweep's own record, ``service.store.sweeps``).

:data:`GRID_POINTS_MAX` bounds a grid: a sweep over it is refused when created (422 naming the
size and the bound) and fails if one was stored before the bound (``service.domain.sweeps``).
"""

import math
import random
from collections.abc import Mapping
from typing import Any, Protocol

# The most points a grid sweep may have. Nothing is built per point (the work per trial is
# O(dimensions)), so the bound is not about memory: a grid is meant to be run in full, and a
# grid larger than this is a random search that should say so (``method: random``).
GRID_POINTS_MAX = 100_000
# Draws of a multiplier before settling for 1 (a coprime draw fails with probability below 0.8
# for any size up to the bound: 64 misses in a row are never seen).
_COPRIME_DRAWS = 64


class GridDimension(Protocol):
    """A dimension of a space (``service.domain.sweeps.spec``) as a grid sees it."""

    def grid_count(self) -> int:
        """How many grid values it has (0: a continuous dimension has none)."""
        ...

    def grid_value(self, digit: int) -> Any:
        """Its ``digit``-th grid value (0 ≤ digit < grid_count())."""
        ...


def grid_size(space: Mapping[str, GridDimension]) -> int:
    """The number of points of the grid over ``space`` (arithmetic: nothing is enumerated)."""
    return math.prod(dim.grid_count() for dim in space.values())


def too_big(space: Mapping[str, GridDimension]) -> str | None:
    """Why a grid over ``space`` is refused (its size and the bound), or None."""
    size = grid_size(space)
    if size <= GRID_POINTS_MAX:
        return None
    return (f"space: the grid has {size:,} points, more than the {GRID_POINTS_MAX:,} a grid "
            "sweep may have; use method 'random' (or 'tpe') with max_trials to sample a large "
            "space")


def grid_point(space: Mapping[str, GridDimension], index: int) -> dict[str, Any]:
    """The point at ``index`` (0 ≤ index < grid size), names in sorted order, the last varying
    fastest."""
    point: dict[str, Any] = {}
    for name in sorted(space, reverse=True):
        index, digit = divmod(index, space[name].grid_count())
        point[name] = space[name].grid_value(digit)
    return dict(sorted(point.items()))


def visit_order(size: int, seed: int) -> tuple[int, int]:
    """``(a, b)`` of the permutation ``k → (a·k + b) mod size`` of a grid of ``size`` points."""
    rng = random.Random(seed)
    b = rng.randrange(size)
    for _ in range(_COPRIME_DRAWS):
        a = rng.randrange(1, size) if size > 2 else 1
        if math.gcd(a, size) == 1:
            return a, b
    return 1, b


def trial_point(space: Mapping[str, GridDimension], seed: int, k: int) -> dict[str, Any]:
    """The point of the grid's ``k``-th trial (0-based; k < grid size)."""
    size = grid_size(space)
    a, b = visit_order(size, seed)
    return grid_point(space, (a * k + b) % size)
