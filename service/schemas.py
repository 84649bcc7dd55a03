"""HTTP shapes (apart from the ORM tables). The job spec itself is ``service.spec.JobSpec``."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Annotated, Literal, get_args

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from service.models import Job, MetricRecord
from service.repository import EPOCH_STEP
from service.scheduler import Waiting
from service.spec import JobSpec, refuse_coercion
from service.state import JobState

# Non-finite metric values travel as these strings (strict JSON has no NaN/Infinity).
NonFinite = Literal["NaN", "Infinity", "-Infinity"]
MetricValue = float | NonFinite
NONFINITE = frozenset(get_args(NonFinite))
# The database keeps naive UTC; the wire says so (RFC 3339 needs an offset: "...Z").
UtcDatetime = Annotated[
    datetime, AfterValidator(lambda d: d if d.tzinfo else d.replace(tzinfo=UTC))
]


class AttemptRead(BaseModel):
    """One run of the worker group. ``startup_failure``: it failed before every rank was ready."""

    number: int
    started_at: float
    ended_at: float | None
    exit_code: int | None
    rank_exit_codes: dict[str, int] = Field(
        default_factory=dict,
        description="rank → exit code, as torchrun reported them (a rank it stopped: -15)",
    )
    reason: str | None
    startup_failure: bool | None


class JobRead(BaseModel):
    """A job. Phase times (UTC): ``created_at`` queued, ``started_at`` launched (resources
    given, shim started), ``running_at`` rendezvous done and rank 0 set up, ``first_metric_at``
    the earliest reported record, ``ended_at`` terminal."""

    id: int
    name: str
    state: JobState
    spec: JobSpec
    created_at: UtcDatetime
    started_at: UtcDatetime | None
    running_at: UtcDatetime | None
    first_metric_at: UtcDatetime | None
    ended_at: UtcDatetime | None
    queue_position: int | None = Field(
        default=None, description="queued jobs: 1-based place in the queue order (priority, FIFO)"
    )
    waiting_reason: str | None = Field(
        default=None, description="queued jobs: why it has not started, e.g. 'needs 2 GPUs; 1 free'"
    )
    exit_code: int | None
    reason: str | None
    pid: int | None
    devices: list[str]
    attempts: list[AttemptRead]

    @classmethod
    def from_row(cls, job: Job, waiting: Waiting | None = None) -> JobRead:
        """``waiting``: the scheduler's view of a queued job (ignored once it left the queue)."""
        queued = job.state == JobState.queued.value and waiting is not None
        return cls(
            id=job.id,
            name=job.name,
            state=JobState(job.state),
            spec=JobSpec.model_validate(job.spec),
            created_at=job.created_at,
            started_at=job.started_at,
            running_at=job.running_at,
            first_metric_at=job.first_metric_at,
            ended_at=job.ended_at,
            queue_position=waiting.position if queued and waiting else None,
            waiting_reason=waiting.reason if queued and waiting else None,
            exit_code=job.exit_code,
            reason=job.reason,
            pid=job.pid,
            devices=job.devices.split(",") if job.devices else [],
            attempts=[AttemptRead.model_validate(a) for a in job.attempts or []],
        )


class JobList(BaseModel):
    items: list[JobRead]
    next_before: int | None = Field(description="pass as ?before= for the next page; null at the end")


class ResourceRead(BaseModel):
    name: str = Field(description="'gpu:<index>' or 'cpu:<slot>'")
    kind: Literal["gpu", "cpu"]
    job_id: int | None = Field(description="the job holding it; null when free")


class ResourceTotals(BaseModel):
    total: int
    allocated: int
    free: int


class ResourcesRead(BaseModel):
    gpu: ResourceTotals
    cpu: ResourceTotals
    items: list[ResourceRead]


class MetricRead(BaseModel):
    seq: int
    attempt: int
    rank: int
    epoch: int
    step: int | None
    name: str
    value: MetricValue
    time: float

    @classmethod
    def from_row(cls, r: MetricRecord) -> MetricRead:
        return cls(
            seq=r.seq,
            attempt=r.attempt,
            rank=r.rank,
            epoch=r.epoch,
            step=None if r.step == EPOCH_STEP else r.step,
            name=r.name,
            value=r.nonfinite if r.nonfinite else r.value,  # type: ignore[arg-type]
            time=r.time,
        )


class MetricsPage(BaseModel):
    job_id: int
    state: JobState
    items: list[MetricRead]
    next_after: int = Field(description="pass as ?after= next time; unchanged when nothing is new")


class RecordPost(BaseModel):
    model_config = ConfigDict(extra="forbid")

    attempt: int = Field(default=1, ge=1, le=10_000)
    rank: int = Field(ge=0, le=65_535)
    epoch: int | None = Field(default=None, ge=0, le=10_000_000)
    step: int | None = Field(default=None, ge=0, le=2**62)
    name: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:/-]+$")]
    value: MetricValue
    time: float = Field(ge=0, le=1e11, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _numbers_are_numbers(cls, data: object) -> object:
        # A rank sends JSON numbers; ``true`` or ``"5"`` is refused, not coerced.
        refuse_coercion(data, frozenset({"attempt", "rank", "epoch", "step", "time"}))
        value = data.get("value") if isinstance(data, dict) else None
        if isinstance(value, bool) or (isinstance(value, str) and value not in NONFINITE):
            raise ValueError("value: must be a number or one of 'NaN', 'Infinity', '-Infinity'")
        return data

    @field_validator("value")
    @classmethod
    def _to_float(cls, v: MetricValue) -> float:
        if isinstance(v, str):
            return {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}[v]
        return float(v)


class RecordBatch(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # Ranks send at most 500 (worker BATCH_MAX); 1000 bounds one request to well under a second
    # of SQL work (10,000 took ~10 s on 2 busy cores: one caller could hold the write lock).
    records: list[RecordPost] = Field(max_length=1000)


class IngestResult(BaseModel):
    accepted: int = Field(description="records stored now")
    duplicates: int = Field(description="records already stored (replays), ignored")


class ErrorDetail(BaseModel):
    field: str | None
    message: str


class ErrorBody(BaseModel):
    error: str
    message: str
    details: list[ErrorDetail] = []
