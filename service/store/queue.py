"""SQL of the queue snapshot (``service.domain.queue.snapshot``): one row, written fenced, read cheaply."""

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from service.store.tables import QueueSnapshot

SNAPSHOT_ID = 1


def write_snapshot(session: Session, waiting: str) -> int | None:
    """Replace the snapshot (the caller holds the lease's fence); its new version, or None
    when the row is missing (a schema not migrated by Alembic)."""
    stmt = (
        update(QueueSnapshot)
        .where(QueueSnapshot.id == SNAPSHOT_ID)
        .values(version=QueueSnapshot.version + 1, waiting=waiting)
        .returning(QueueSnapshot.version)
    )
    return session.execute(stmt).scalar_one_or_none()


def snapshot_version(session: Session) -> int | None:
    """The snapshot's version alone: what a reader checks before fetching the whole text."""
    return session.execute(
        select(QueueSnapshot.version).where(QueueSnapshot.id == SNAPSHOT_ID)
    ).scalar_one_or_none()


def read_snapshot(session: Session) -> tuple[int, str] | None:
    """(version, encoded waiting jobs), or None when there is no row."""
    row = session.execute(
        select(QueueSnapshot.version, QueueSnapshot.waiting).where(QueueSnapshot.id == SNAPSHOT_ID)
    ).first()
    return None if row is None else (row[0], row[1])
