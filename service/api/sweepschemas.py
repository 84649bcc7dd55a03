"""HTTP shapes of sweeps (``/sweeps``, docs/sweeps.md)."""

import math

from pydantic import BaseModel, Field

from service.api.schemas import UtcDatetime
from service.domain.sweeps.manage import SweepView, TrialView
from service.domain.sweeps.series import TrialLine
from service.domain.sweeps.spec import SweepSpec
from torchyard_contract.bounds import bounded_text
from torchyard_contract.records import MetricValue, to_wire
from torchyard_contract.state import JobState, SweepStateName, TrialOutcomeName


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


class EpochValue(BaseModel):
    epoch: int
    value: float | None = Field(description="the objective reduced across ranks; null when "
                                "not finite")


class TrialRead(BaseModel):
    job_id: int
    params: dict[str, bool | int | float | str]
    state: JobState = Field(description="the job's state (a deleted job's when it was deleted)")
    outcome: TrialOutcomeName | None = Field(
        description="null while queued or running; a pruned trial's job is 'cancelled'")
    value: float | None = Field(description="completed trials: the objective at the last epoch")
    reason: str | None = Field(description="why it ended (a pruned one: the rule, the epoch, "
                               "the comparison)")
    epochs: list[EpochValue] = Field(description="the objective per epoch, reduced across "
                                     "ranks; only epochs every rank reported (none once its "
                                     "job was deleted)")
    deleted: bool = Field(description="its job was deleted: state, outcome, value and reason "
                          "are the sweep's record of it, and it still counts in counts and best")

    @classmethod
    def from_view(cls, t: TrialView) -> "TrialRead":
        return cls(
            job_id=t.job_id, params=t.params, state=JobState(t.state),
            outcome=t.outcome,  # type: ignore[arg-type]
            value=_finite(t.value), reason=bounded_text(t.reason) if t.reason else None,
            epochs=[EpochValue(epoch=e, value=_finite(v)) for e, v in t.epochs.items()],
            deleted=t.deleted,
        )


class BestTrial(BaseModel):
    job_id: int
    params: dict[str, bool | int | float | str]
    value: float


class SweepRead(BaseModel):
    """A sweep: its request, state, counts of its trials by outcome, the best so far, and every
    trial (``GET /sweeps/{id}``; the list leaves ``trials`` empty)."""

    id: int
    name: str
    state: SweepStateName
    reason: str | None
    created_at: UtcDatetime
    ended_at: UtcDatetime | None
    spec: SweepSpec
    counts: dict[str, int] = Field(description="trials by outcome: queued, running, "
                                   "completed, pruned, failed, cancelled")
    best: BestTrial | None
    trials: list[TrialRead]
    owner: str | None = Field(default=None, description="who made it; its trials are theirs")
    team: str | None = Field(default=None, description="its team (its trials' team)")

    @classmethod
    def from_view(cls, v: SweepView, with_trials: bool = True) -> "SweepRead":
        best = v.best
        return cls(
            id=v.sweep.id, name=v.sweep.name, state=v.sweep.state,  # type: ignore[arg-type]
            reason=v.sweep.reason, created_at=v.sweep.created_at, ended_at=v.sweep.ended_at,
            spec=SweepSpec.model_validate(v.sweep.spec), counts=v.counts,
            best=BestTrial(job_id=best.job_id, params=best.params, value=best.value)
            if best is not None and best.value is not None else None,
            trials=[TrialRead.from_view(t) for t in v.trials] if with_trials else [],
            owner=v.sweep.owner, team=v.sweep.team,
        )


class SweepList(BaseModel):
    items: list[SweepRead]
    next_before: int | None = Field(description="pass as ?before= for the next page; null at the end")


class TrialSeries(BaseModel):
    """One trial as the sweep's page shows it: its row and its objective per epoch."""

    job_id: int
    params: dict[str, bool | int | float | str]
    state: JobState
    outcome: TrialOutcomeName | None
    value: float | None = Field(description="completed trials: the objective at the last epoch")
    pruned_epoch: int | None = Field(description="a pruned trial: the epoch it was stopped at")
    reason: str | None
    x: list[int] = Field(description="epochs, ascending (downsampled to max_points)")
    y: list[MetricValue] = Field(description="the objective at each epoch, reduced across ranks")
    points: int = Field(description="epochs with a value before downsampling")

    @classmethod
    def from_line(cls, line: TrialLine) -> "TrialSeries":
        t = line.trial
        return cls(
            job_id=t.job_id, params=t.params, state=JobState(t.state),
            outcome=t.outcome,  # type: ignore[arg-type]
            value=_finite(t.value), pruned_epoch=line.pruned_epoch,
            reason=bounded_text(t.reason) if t.reason else None,
            x=line.x, y=[to_wire(v) for v in line.y], points=line.points,
        )


class SweepSeries(BaseModel):
    """``GET /sweeps/{id}/series``: the sweep (without ``trials``) and a line per trial."""

    sweep: SweepRead
    max_points: int
    trials: list[TrialSeries] = Field(description="oldest first")
