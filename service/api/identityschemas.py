"""Request and response shapes of teams, users, tokens, ``/me`` and the audit log.

A team's settings are one model (``TeamFields``): ``POST /teams`` takes them with the name,
``PATCH /teams/{name}`` any subset (fields left out stay as they are; ``null`` clears one that
may be null). Each is a column of ``teams``; what the scheduler makes of ``quota``, ``share``
and ``max_priority`` is docs/scheduling.md, "Teams: quotas, fair share and budgets".
"""

from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
)

from service.api.schemas import UtcDatetime
from service.api.usageschemas import (
    SHARE_MAX,
    FairShareRead,
    Quota,
    TeamUsageRead,
    standing_parts,
)
from service.domain.identity.caller import Role
from service.domain.queue.quota import DEFAULT_MAX_PRIORITY
from service.domain.queue.standing import Standing
from service.store.tables import ApiToken, AuditEntry, Team, User
from torchyard_contract.spec_types import NUMBER_ONLY, PRIORITY_MAX, PRIORITY_MIN, SlurmName

NAME_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,62}$"
Name = Annotated[str, StringConstraints(pattern=NAME_PATTERN)]
UNIX_USER_PATTERN = r"^[a-z_][a-z0-9_-]{0,31}$"
TOKEN_DAYS_MAX = 3650


class TeamFields(BaseModel):
    model_config = ConfigDict(extra="forbid")

    unix_user: Annotated[str, StringConstraints(pattern=UNIX_USER_PATTERN)] | None = Field(
        default=None, description="the Unix user its jobs run as when the server runs as root "
        "(must exist on this host, and on every Slurm node; not root, not the server's own "
        "user); null = the server's user")
    quota: Quota | None = Field(default=None, description="slots held at once and slot-hours "
                                "per period; null = unlimited. PATCH merges it: the quota's "
                                "fields sent change, null clears one")
    # Left out: unchanged (PATCH) or the default (POST); never null.
    share: Annotated[float, NUMBER_ONLY] = Field(
        default=1.0, gt=0, le=SHARE_MAX, allow_inf_nan=False,
        description="fair-share weight: its factor is its recent usage divided by this (2 = it "
        "may use twice as much as a team of 1)")
    max_priority: Annotated[int, NUMBER_ONLY] = Field(
        default=DEFAULT_MAX_PRIORITY, ge=PRIORITY_MIN, le=PRIORITY_MAX,
        description="the highest priority its members may submit (422 above it); admins "
        "submit at any")
    slurm_account: SlurmName | None = Field(
        default=None, description="Slurm executor: the account its jobs are charged to "
        "(sbatch --account) unless the spec names one; members may name no other")
    slurm_qos: SlurmName | None = Field(
        default=None, description="Slurm executor: its jobs' QOS (sbatch --qos) unless the spec "
        "names one; members may name no other")


class TeamCreate(TeamFields):
    name: Name = Field(description="lower-case letters, digits, '.', '_', '-'; at most 63")


class TeamPatch(TeamFields):
    """Only the fields sent change."""


class TeamRead(BaseModel):
    name: str
    created_at: UtcDatetime
    unix_user: str | None
    isolation: str = Field(description="what keeps this team's jobs apart from other teams' "
                           "on this host, said plainly (without unix_user, or when the server "
                           "is not root, API roles do not isolate files or processes)")
    quota: Quota | None
    share: float
    max_priority: int
    slurm_account: str | None
    slurm_qos: str | None
    usage: TeamUsageRead | None = Field(default=None, description="what it holds and used")
    fair_share: FairShareRead | None = Field(default=None, description="its factor and rank")

    @classmethod
    def from_row(cls, team: Team, isolation: str, standing: Standing | None = None) -> "TeamRead":
        usage, fair_share = standing_parts(standing)
        return cls(name=team.name, created_at=team.created_at, unix_user=team.unix_user,
                   isolation=isolation, quota=_quota(team.quota), share=team.share,
                   max_priority=team.max_priority, slurm_account=team.slurm_account,
                   slurm_qos=team.slurm_qos, usage=usage, fair_share=fair_share)


def _quota(stored: object) -> Quota | None:
    """The stored quota (the API wrote it); one that no longer validates reads as none."""
    if not isinstance(stored, dict):
        return None
    try:
        return Quota.model_validate(stored)
    except ValidationError:
        return None


class UserCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: Name = Field(description="as a JWT's user claim names them; lower-case letters, "
                       "digits, '.', '_', '-'")
    team: Name | None = Field(default=None, description="required for a member or viewer")
    role: Role = Field(default=Role.member, description="admin, member or viewer")


class UserPatch(BaseModel):
    model_config = ConfigDict(extra="forbid")

    team: Name | None = Field(default=None, description="null: no team (an admin only)")
    # Left out: unchanged; never null (the schema says so: the default is not validated).
    role: Role = Field(default=None, description="admin, member or viewer")  # type: ignore[assignment]
    disabled: bool = Field(default=None, strict=True, description="true: every token and JWT of "  # type: ignore[assignment]
                           "theirs is refused (401) until false again")


class UserRead(BaseModel):
    name: str
    team: str | None
    role: Role
    disabled: bool
    created_at: UtcDatetime

    @classmethod
    def from_row(cls, user: User) -> "UserRead":
        return cls(name=user.name, team=user.team, role=Role(user.role), disabled=user.disabled,
                   created_at=user.created_at)


class TokenCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9 ._-]{0,63}$")] = Field(
        description="what it is for (laptop, ci, …)")
    expires_in_days: int = Field(default=90, ge=1, le=TOKEN_DAYS_MAX)


class TokenRead(BaseModel):
    """A token as listed: never the token itself."""

    id: int
    name: str
    created_at: UtcDatetime
    expires_at: UtcDatetime | None
    last_used_at: UtcDatetime | None = Field(description="at most a minute behind")
    revoked: bool

    @classmethod
    def from_row(cls, token: ApiToken) -> "TokenRead":
        return cls(id=token.id, name=token.name, created_at=token.created_at,
                   expires_at=token.expires_at, last_used_at=token.last_used_at,
                   revoked=token.revoked_at is not None)


class TokenCreated(BaseModel):
    id: int
    name: str
    token: str = Field(description="shown this once; the server keeps only its SHA-256")
    expires_at: UtcDatetime


class Me(BaseModel):
    user: str
    team: str | None
    role: Role
    token_id: int | None = Field(description="the personal token used; null otherwise")
    via: Literal["open", "bootstrap", "token", "jwt"] = Field(
        description="open: no sign-in on this server; bootstrap: TORCHYARD_API_TOKENS; "
        "token: a personal token; jwt: an identity provider's token")


class AuditRead(BaseModel):
    id: int
    at: UtcDatetime
    actor: str | None = Field(description="the user; null when nobody signed in")
    via: str | None
    token_id: int | None
    method: str
    route: str = Field(description="the route template, e.g. /jobs/{job_id}/cancel")
    target: str | None = Field(description="what it acted on: 'job 12', 'user alice', …")
    status: int
    client: str | None

    @classmethod
    def from_row(cls, row: AuditEntry) -> "AuditRead":
        return cls(id=row.id, at=row.at, actor=row.actor, via=row.via, token_id=row.token_id,
                   method=row.method, route=row.route, target=row.target, status=row.status,
                   client=row.client)


class AuditPage(BaseModel):
    items: list[AuditRead]
    next_after: int = Field(description="pass as ?after= for the next entries")
