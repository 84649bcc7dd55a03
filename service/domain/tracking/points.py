"""Stored records → the points both exports write: pure functions, no I/O.

Every record gives one point of its rank's series ``<name>/rank<r>``: ``step`` = the epoch (the
record's ``step`` for a per-step record), ``timestamp`` = when the rank reported it (ms). A
restarted attempt's repeated epochs are points of their own (the same step, their own
timestamps): the per-rank series keep every attempt.

The cross-rank mean of a per-epoch metric is the series ``<name>``, the mean the dashboard draws
(``service.domain.records.downsample.epoch_mean``: per epoch, each rank's value from its latest
attempt, averaged over the ranks; a NaN or ±inf of any rank makes the mean NaN or ±inf). A
:class:`MeanFold` folds the per-epoch records in ``seq`` order and gives a mean point as soon as
an epoch is complete — every rank of the job reported it in the latest attempt that reported it
— timestamped with the newest of those records. A later attempt that completes the epoch again
gives another point at the same step with a later timestamp (MLflow's latest value, and
TensorBoard's last, are then the latest attempt's). When the job ends, :meth:`MeanFold.final`
gives the epochs whose dashboard mean was not yet written as it stands (a metric only some
ranks report; an epoch a failed attempt left half done).

Deterministic: the same records in the same ``seq`` order give the same points, however they
are cut into batches, so a batch computed again after a crash is the same batch
(docs/tracking.md).
"""

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from service.store.records import EPOCH_STEP  # the stored step of a per-epoch record
from torchyard_contract.records import decode_value


@dataclass(frozen=True)
class Point:
    """One value of one series, as MLflow's ``Metric`` and TensorBoard's scalar take it."""

    key: str
    step: int
    timestamp_ms: int
    value: float  # may be NaN or ±inf


def record_value(row: Any) -> float:
    """A stored record's value; non-finite ones are stored by name."""
    return decode_value(row.nonfinite) if row.nonfinite else float(row.value)


def timestamp_ms(time_s: float) -> int:
    return int(round(time_s * 1000))


def rank_point(row: Any) -> Point:
    """The point of a stored record (``seq``, ``attempt``, ``rank``, ``epoch``, ``step``,
    ``name``, ``value``, ``nonfinite``, ``time``) in its rank's series."""
    step = row.epoch if row.step == EPOCH_STEP else row.step
    return Point(f"{row.name}/rank{row.rank}", int(step), timestamp_ms(row.time),
                 record_value(row))


def mean(values: list[float]) -> float:
    """The plain mean, as ``epoch_mean`` takes it: a NaN or inf of any value carries over."""
    return sum(values) / len(values)


@dataclass
class _Epoch:
    # rank → (attempt, value, time): each rank's latest attempt's record of this epoch.
    ranks: dict[int, tuple[int, float, float]] = field(default_factory=dict)
    written: tuple[int, float] | None = None  # (timestamp ms, value) of the last mean point


@dataclass
class MeanFold:
    """The cross-rank means of one job's per-epoch metrics, folded record by record."""

    world_size: int
    epochs: dict[tuple[str, int], _Epoch] = field(default_factory=dict)

    def add(self, row: Any) -> Point | None:
        """Fold one stored record in (per-step records are left out); the mean point of its
        epoch when this record completes it."""
        if row.step != EPOCH_STEP:
            return None
        epoch = self.epochs.setdefault((row.name, row.epoch), _Epoch())
        held = epoch.ranks.get(row.rank)
        if held is not None and held[0] > row.attempt:
            return None  # an older attempt's record, stored late: the newer one counts
        epoch.ranks[row.rank] = (row.attempt, record_value(row), row.time)
        latest = max(a for a, _, _ in epoch.ranks.values())
        complete = sum(1 for a, _, _ in epoch.ranks.values() if a == latest) >= self.world_size
        if not complete:
            return None
        return self._write(row.name, row.epoch, epoch)

    def fold(self, rows: Iterable[Any]) -> list[Point]:
        """``add`` each row in order; the mean points they give."""
        return [p for p in (self.add(r) for r in rows) if p is not None]

    def final(self) -> list[Point]:
        """At the job's end: the mean of every epoch whose last mean point (if any) differs from
        the dashboard's mean of what was stored, by name then epoch."""
        points = []
        for (name, number), epoch in sorted(self.epochs.items()):
            point = self._point(name, number, epoch)
            if (point.timestamp_ms, _same(point.value)) != _written(epoch):
                epoch.written = (point.timestamp_ms, point.value)
                points.append(point)
        return points

    def _write(self, name: str, number: int, epoch: _Epoch) -> Point | None:
        point = self._point(name, number, epoch)
        if (point.timestamp_ms, _same(point.value)) == _written(epoch):
            return None
        epoch.written = (point.timestamp_ms, point.value)
        return point

    @staticmethod
    def _point(name: str, number: int, epoch: _Epoch) -> Point:
        ranks = sorted(epoch.ranks.items())
        value = mean([v for _, (_, v, _) in ranks])
        newest = max(t for _, (_, _, t) in ranks)
        return Point(name, number, timestamp_ms(newest), value)


def _same(value: float) -> object:
    """A value as compared with another: every NaN is the same NaN."""
    return "NaN" if math.isnan(value) else value


def _written(epoch: _Epoch) -> tuple[int, object] | None:
    if epoch.written is None:
        return None
    return epoch.written[0], _same(epoch.written[1])
