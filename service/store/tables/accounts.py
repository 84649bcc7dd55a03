"""Who is who and who used what: teams, users, their API tokens, package grants, the audit log
and the slot usage account."""

from datetime import datetime

from sqlalchemy import (
    JSON,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Integer,
    String,
    false,
)
from sqlalchemy.orm import Mapped, mapped_column

from service.store.tables.base import Base, Int64


class Team(Base):
    """A team: the unit jobs, sweeps, secrets and packages belong to. One column per setting,
    each settable by ``POST``/``PATCH /teams`` (``service.api.identityschemas``); what the
    scheduler makes of them: docs/scheduling.md, "Teams: quotas, fair share and budgets"."""

    __tablename__ = "teams"
    __table_args__ = ({"sqlite_autoincrement": True},)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(DateTime)
    # The Unix user its jobs run as when the server runs as root (issue 46, item 6); null =
    # the server's own user.
    unix_user: Mapped[str | None] = mapped_column(String(32))
    # {"max_slots": int | null, "slot_hours": float | null, "period": "month" | "rolling_30d"};
    # null = unlimited (service.domain.queue.quota reads it). 0018_fair_share.
    quota: Mapped[dict | None] = mapped_column(JSON)
    # The fair-share weight: a team's factor is its recent usage divided by this.
    share: Mapped[float] = mapped_column(Float, default=1.0, server_default="1")
    # The highest priority its members may submit (admins: any).
    max_priority: Mapped[int] = mapped_column(Integer, default=50, server_default="50")
    # Passed to sbatch as --account / --qos (the Slurm executor).
    slurm_account: Mapped[str | None] = mapped_column(String(64))
    slurm_qos: Mapped[str | None] = mapped_column(String(64))


class SlotUsage(Base):
    """Who used what (``service.store.usage``): one row each time a job starts holding slots,
    written with the allocation (local) or when the executor says it started (Slurm), closed
    once — compare-and-set on ``ended_at IS NULL`` — when they are freed, so a restart never
    counts a run twice. Times: seconds since the epoch on the writing server's clock. Team and
    owner are the job's, copied: the account outlives the job (no foreign key)."""

    __tablename__ = "slot_usage"
    __table_args__ = ({"sqlite_autoincrement": True},)

    id: Mapped[int] = mapped_column(Int64, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(Integer, index=True)
    team: Mapped[str | None] = mapped_column(String(64))
    owner: Mapped[str | None] = mapped_column(String(64))
    slots: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[float] = mapped_column(Float)
    ended_at: Mapped[float | None] = mapped_column(Float, index=True)


class User(Base):
    """A person or a pipeline. ``role``: admin, member or viewer (``service.domain.identity``);
    members and viewers belong to a team, an admin may. A disabled user's tokens and JWTs are
    refused. Users are never deleted (their name stays on their jobs and in the audit log)."""

    __tablename__ = "users"
    __table_args__ = ({"sqlite_autoincrement": True},)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    team: Mapped[str | None] = mapped_column(ForeignKey("teams.name"), index=True)
    role: Mapped[str] = mapped_column(String(16))
    disabled: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    created_at: Mapped[datetime] = mapped_column(DateTime)


class ApiToken(Base):
    """A personal token: only its SHA-256 is stored (the token is shown once). Revoked tokens
    stay (their id is in the audit log); ``last_used_at`` is written at most once a minute."""

    __tablename__ = "api_tokens"
    __table_args__ = ({"sqlite_autoincrement": True},)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(64))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(DateTime)
    expires_at: Mapped[datetime | None] = mapped_column(DateTime)
    last_used_at: Mapped[datetime | None] = mapped_column(DateTime)
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime)


class PackageGrant(Base):
    """Which teams uploaded a package (``service.domain.files.packages`` keeps one copy of the
    bytes): a team sees and names only digests it uploaded itself."""

    __tablename__ = "package_grants"

    digest: Mapped[str] = mapped_column(String(71), primary_key=True)
    team: Mapped[str] = mapped_column(String(64), primary_key=True)
    granted_at: Mapped[datetime] = mapped_column(DateTime)


class AuditEntry(Base):
    """The audit log: appended to by every state-changing request and every refusal for
    authentication or authorization (``service.api.middleware.audit``); no route changes or
    deletes a row; the clean-up pass drops rows past ``TORCHYARD_AUDIT_RETENTION_DAYS``."""

    __tablename__ = "audit_log"
    __table_args__ = ({"sqlite_autoincrement": True},)

    id: Mapped[int] = mapped_column(Int64, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(DateTime, index=True)
    actor: Mapped[str | None] = mapped_column(String(64), index=True)  # null: not signed in
    via: Mapped[str | None] = mapped_column(String(16))
    token_id: Mapped[int | None] = mapped_column(Integer)
    method: Mapped[str] = mapped_column(String(8))
    route: Mapped[str] = mapped_column(String(200))
    target: Mapped[str | None] = mapped_column(String(100))
    status: Mapped[int] = mapped_column(Integer)
    client: Mapped[str | None] = mapped_column(String(64))
