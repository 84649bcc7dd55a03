"""SQL of the audit log: append, read by cursor, prune past retention. Nothing else writes it;
no route updates or deletes a row (``service.api.middleware.audit`` appends)."""

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from service.store.clock import utcnow
from service.store.tables import AuditEntry


@dataclass(frozen=True)
class AuditRow:
    """One entry as it is appended (never a token: only the token's id)."""

    actor: str | None
    via: str | None
    token_id: int | None
    method: str
    route: str
    target: str | None
    status: int
    client: str | None


def append(session: Session, row: AuditRow) -> None:
    session.add(AuditEntry(
        at=utcnow(), actor=row.actor, via=row.via, token_id=row.token_id, method=row.method,
        route=row.route[:200], target=row.target[:100] if row.target else None,
        status=row.status, client=row.client[:64] if row.client else None,
    ))


def page(
    session: Session, after: int, limit: int, actor: str | None = None
) -> Sequence[AuditEntry]:
    """Entries with ``id > after``, oldest first."""
    q = select(AuditEntry).where(AuditEntry.id > after).order_by(AuditEntry.id).limit(limit)
    if actor is not None:
        q = q.where(AuditEntry.actor == actor)
    return session.scalars(q).all()


def prune(session: Session, before: datetime, batch: int) -> int:
    """Delete at most ``batch`` of the oldest entries older than ``before``; how many went."""
    ids = session.scalars(
        select(AuditEntry.id).where(AuditEntry.at < before).order_by(AuditEntry.id).limit(batch)
    ).all()
    if ids:
        session.execute(delete(AuditEntry).where(AuditEntry.id.in_(ids)))
    return len(ids)
