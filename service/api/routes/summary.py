"""``GET /jobs/{id}/metrics/summary``: one per-epoch metric across ranks, with diverging ranks.

The statistics and the divergence rule live in :mod:`service.domain.records.summary`.
"""

from typing import Annotated

from fastapi import APIRouter, Query
from pydantic import BaseModel, Field

from service.api.deps import JobDep, SessionDep
from service.domain.records.summary import DEFAULT_THRESHOLD, EpochValue, summarize
from service.store import series
from torchyard_contract.records import MetricValue, decode_value, to_wire

router = APIRouter(prefix="/jobs", tags=["metrics"])


class EpochSummaryRead(BaseModel):
    epoch: int
    attempt: int = Field(description="the latest attempt that reported this epoch")
    count: int = Field(description="ranks that reported the metric this epoch")
    mean: float | None = Field(description="over the finite values; null when none is finite")
    min: float | None
    max: float | None
    std: float | None = Field(description="population standard deviation of the finite values")
    ranks: dict[str, MetricValue] = Field(description="rank → value (non-finite as strings)")
    diverged_ranks: list[int]


class MetricSummary(BaseModel):
    job_id: int
    name: str
    threshold: float
    items: list[EpochSummaryRead]




def _float(value: float | None, nonfinite: str | None) -> float:
    return decode_value(nonfinite) if nonfinite else float(value)  # type: ignore[arg-type]


@router.get("/{job_id}/metrics/summary", response_model=MetricSummary)
def metric_summary(
    job: JobDep,
    session: SessionDep,
    name: Annotated[str, Query(min_length=1, max_length=64)] = "loss",
    threshold: Annotated[
        float, Query(gt=0, le=1e6, description="relative distance from the reference rank value")
    ] = DEFAULT_THRESHOLD,
) -> MetricSummary:
    """Per epoch: count/mean/min/max/std across ranks, and the diverging ranks (docs/metrics.md)."""
    job_id = job.id
    values = [
        EpochValue(attempt, rank, epoch, _float(value, nonfinite))
        for attempt, rank, epoch, _step, value, nonfinite
        in series.series_rows(session, job_id, name, steps=False)
    ]
    items = [
        EpochSummaryRead(
            epoch=s.epoch, attempt=s.attempt, count=s.count, mean=s.mean, min=s.min, max=s.max,
            std=s.std, ranks={str(r): to_wire(v) for r, v in s.ranks.items()},
            diverged_ranks=s.diverged_ranks,
        )
        for s in summarize(values, threshold)
    ]
    return MetricSummary(job_id=job_id, name=name, threshold=threshold, items=items)
