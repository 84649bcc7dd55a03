"""Shapes of teams' quotas and standings (``GET /teams``) and of the usage account
(``GET /usage``): docs/scheduling.md, "Teams: quotas, fair share and budgets"."""

from datetime import UTC, datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from service.api.schemas import UtcDatetime
from service.domain.queue.budget import Period
from service.domain.queue.standing import Standing
from service.store.usage import UsageTotal
from torchyard_contract.spec_types import NUMBER_ONLY

MAX_SLOTS_MAX = 1_000_000
SLOT_HOURS_MAX = 1e9
SHARE_MAX = 1e6


class Quota(BaseModel):
    """What a team may hold and spend; a field left out or null is not limited."""

    model_config = ConfigDict(extra="forbid")

    max_slots: Annotated[int, Field(ge=0, le=MAX_SLOTS_MAX), NUMBER_ONLY] | None = Field(
        default=None,
        description="slots (GPUs, or CPU slots: one per rank) its running jobs hold at most; "
        "only preemptible jobs start past it, on idle slots (borrowed, taken back when another "
        "team within its quota needs them); a job that is not preemptible and needs more is "
        "refused at submit (422). Local executor (on Slurm: the account's GrpTRES)")
    slot_hours: Annotated[
        float, Field(ge=0, le=SLOT_HOURS_MAX, allow_inf_nan=False), NUMBER_ONLY
    ] | None = Field(
        default=None,
        description="slot-hours it may use per period; past it, its queued jobs wait (running "
        "ones are not stopped) until the period resets or an admin raises it. Local executor")
    period: Period = Field(
        default=Period.month, description="what slot_hours counts over: 'month' (the calendar "
        "month in UTC) or 'rolling_30d' (the last 30 days)")


def _utc(at: float | None) -> datetime | None:
    return datetime.fromtimestamp(at, UTC) if at is not None else None


class TeamUsageRead(BaseModel):
    """Where the team stands now (slot-hours; a slot is one GPU or CPU slot)."""

    running_slots: int = Field(description="slots its jobs hold now")
    borrowed_slots: int = Field(description="of those, past its max_slots (preemptible jobs "
                                "on idle slots, which a reclaim takes back)")
    recent_slot_hours: float = Field(description="slot-hours used, each decayed by its age "
                                     "(half-life TORCHYARD_USAGE_HALF_LIFE_H)")
    period: Period
    period_start: UtcDatetime
    resets_at: UtcDatetime | None = Field(description="null for a rolling window")
    period_slot_hours: float = Field(description="slot-hours used in the current period")
    budget_spent: str | None = Field(description="past slot_hours: why its queued jobs wait; "
                                     "else null")


class FairShareRead(BaseModel):
    factor: float = Field(description="recent_slot_hours / share: the lowest starts first")
    rank: int = Field(description="1 = the team whose jobs come first in fair-share order")


def standing_parts(standing: Standing | None) -> tuple[TeamUsageRead | None, FairShareRead | None]:
    if standing is None:
        return None, None
    return TeamUsageRead(
        running_slots=standing.running_slots, borrowed_slots=standing.borrowed_slots,
        recent_slot_hours=round(standing.recent_slot_hours, 6), period=standing.rules.period,
        period_start=_utc(standing.period_start), resets_at=_utc(standing.resets_at),
        period_slot_hours=round(standing.period_slot_hours, 6), budget_spent=standing.spent,
    ), FairShareRead(factor=round(standing.factor, 6), rank=standing.rank)


class UsageRow(BaseModel):
    team: str | None
    user: str | None = Field(description="null unless grouped by user or job")
    job_id: int | None = Field(description="null unless grouped by job")
    slot_seconds: float = Field(description="slot-seconds inside [since, until]: slots held × "
                                "time held, queued and paused time not counted")
    jobs: int = Field(description="distinct jobs")
    attempts: int = Field(description="runs: each start of a job holding slots (its first, and "
                          "one more per resume after a pause or preemption, per restart "
                          "elsewhere); a restart in place after a failure is inside one run")

    @classmethod
    def of(cls, total: UsageTotal) -> "UsageRow":
        return cls(team=total.team, user=total.user, job_id=total.job_id,
                   slot_seconds=round(total.slot_seconds, 3), jobs=total.jobs,
                   attempts=total.attempts)


class UsageReport(BaseModel):
    group_by: Literal["team", "user", "job"]
    since: UtcDatetime | None
    until: UtcDatetime
    items: list[UsageRow] = Field(description="largest slot_seconds first")
