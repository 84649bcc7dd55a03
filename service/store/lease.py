"""SQL of the supervisor lease (``service.domain.lease``): claim or renew, check under a lock, release."""

from sqlalchemy import ColumnElement, case, func, literal_column, select, update
from sqlalchemy.orm import Session

from service.store.tables import SupervisorLease

LEASE_NAME = "supervisor"


def _db_now(session: Session) -> ColumnElement[float]:
    """Seconds since the epoch on the database's clock (the one clock every server shares)."""
    if session.get_bind().dialect.name == "postgresql":
        # clock_timestamp(), not now(): now() is frozen at the start of the transaction.
        return literal_column("extract(epoch from clock_timestamp())::float8")
    return literal_column("((julianday('now') - 2440587.5) * 86400.0)")


def _set_local(session: Session, name: str, seconds: float) -> None:
    """A PostgreSQL setting for the rest of this transaction only (no-op on SQLite)."""
    if session.get_bind().dialect.name == "postgresql":
        session.execute(
            select(func.set_config(name, f"{max(1, int(seconds * 1000))}ms", True))
        )


def claim_lease(session: Session, owner: str, host: str, ttl_s: float) -> int | None:
    """Take the lease if it is free or expired, or renew it if ``owner`` holds it; the lease's
    generation if ``owner`` holds it now (new owner: generation + 1), else None.

    Waits at most a sixth of ``ttl_s`` for the row (a fenced transaction may hold it; see
    ``holds_lease``), then raises: the caller tries again on its next round."""
    _set_local(session, "lock_timeout", ttl_s / 6)
    lease = SupervisorLease
    now = _db_now(session)
    stmt = (
        update(lease)
        .where(lease.name == LEASE_NAME, (lease.owner == owner) | (lease.expires_at < now))
        .values(
            generation=case((lease.owner == owner, lease.generation), else_=lease.generation + 1),
            owner=owner,
            host=host,
            expires_at=now + ttl_s,
            renewed_at=now,
        )
        .returning(lease.generation)
    )
    return session.execute(stmt).scalar_one_or_none()


def take_over(
    session: Session, dead_owner: str, owner: str, host: str, ttl_s: float
) -> int | None:
    """Take the lease from ``dead_owner`` (known gone) before it expires; the new generation,
    or None if the lease changed hands meanwhile."""
    lease = SupervisorLease
    now = _db_now(session)
    stmt = (
        update(lease)
        .where(lease.name == LEASE_NAME, lease.owner == dead_owner)
        .values(generation=lease.generation + 1, owner=owner, host=host,
                expires_at=now + ttl_s, renewed_at=now)
        .returning(lease.generation)
    )
    return session.execute(stmt).scalar_one_or_none()


def holds_lease(session: Session, owner: str, generation: int, idle_limit_s: float) -> bool:
    """True if ``owner`` holds an unexpired lease of ``generation``. On PostgreSQL the row is
    then share-locked to the end of the transaction: no one can take the lease over before this
    transaction ends, so whatever it writes is written under the lease (fencing). On SQLite the
    writer's ``BEGIN IMMEDIATE`` gives the same.

    A holder stalled inside such a transaction (paused, cut off) must not block a takeover for
    good: PostgreSQL ends the transaction once it sits idle ``idle_limit_s``."""
    _set_local(session, "idle_in_transaction_session_timeout", idle_limit_s)
    lease = SupervisorLease
    q = (
        select(lease.name)
        .where(
            lease.name == LEASE_NAME,
            lease.owner == owner,
            lease.generation == generation,
            lease.expires_at > _db_now(session),
        )
        .with_for_update(read=True)
    )
    return session.execute(q).first() is not None


def release_lease(session: Session, owner: str) -> None:
    """Give the lease up at once (a clean stop), so a standby need not wait for it to expire."""
    session.execute(
        update(SupervisorLease)
        .where(SupervisorLease.name == LEASE_NAME, SupervisorLease.owner == owner)
        .values(expires_at=0.0)
    )


def lease_row(session: Session) -> SupervisorLease | None:
    return session.get(SupervisorLease, LEASE_NAME)
