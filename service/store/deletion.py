"""Deleting jobs in SQL (``DELETE /jobs/{id}``, retention: ``service.domain.files.cleanup``)."""

from datetime import datetime

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from service.store.changefeed import note_change
from service.store.outbox import delete_finished_deliveries
from service.store.repository import job_state
from service.store.tables import Allocation, Job, JobLabel, MetricRecord, TrackingExport
from torchyard_contract.state import TERMINAL_STATES, JobState

# Every table that holds rows of a job besides ``jobs`` and the webhook outbox; deleting a job
# empties each of them. Of the outbox only the finished deliveries go: pending ones are still
# sent, then removed (``service.store.outbox``).
JOB_OWNED_TABLES: tuple[type, ...] = (MetricRecord, JobLabel, Allocation, TrackingExport)


def delete_record_batch(session: Session, job_id: int, limit: int) -> int:
    """Delete up to ``limit`` of the job's metric records (oldest first); how many went. Small
    batches, each its own transaction, keep a long history from holding the write lock."""
    seqs = select(MetricRecord.seq).where(MetricRecord.job_id == job_id).order_by(
        MetricRecord.seq).limit(limit)
    result = session.execute(delete(MetricRecord).where(MetricRecord.seq.in_(seqs)))
    return int(result.rowcount or 0)  # type: ignore[attr-defined]


def delete_job_rows(session: Session, job_id: int) -> bool:
    """Delete a terminal job and every row it owns (``JOB_OWNED_TABLES``, its finished webhook
    deliveries); False when it is gone or not terminal (compare-and-delete: a job that was
    re-queued or is running stays). Its pending deliveries stay, to be sent."""
    state = job_state(session, job_id)
    if state is None or JobState(state) not in TERMINAL_STATES:  # terminal stays terminal
        return False
    for table in JOB_OWNED_TABLES:  # children first: no foreign key is ever left dangling
        session.execute(delete(table).where(table.job_id == job_id))  # type: ignore[attr-defined]
    delete_finished_deliveries(session, job_id)
    session.execute(delete(Job).where(Job.id == job_id))
    note_change(session, job_id)
    return True


def terminal_jobs_ended_before(session: Session, cutoff: datetime, limit: int) -> list[int]:
    """Ids of terminal jobs that ended before ``cutoff``, oldest first."""
    terminal = [s.value for s in TERMINAL_STATES]
    q = select(Job.id).where(Job.state.in_(terminal), Job.ended_at < cutoff)
    return list(session.scalars(q.order_by(Job.ended_at, Job.id).limit(limit)))


def packages_in_use(session: Session) -> set[str]:
    """Packages that queued or running jobs name (the ones the store must keep)."""
    live = [s.value for s in JobState if s not in TERMINAL_STATES]
    specs = session.scalars(select(Job.spec).where(Job.state.in_(live)))
    return {s["package"] for s in specs if isinstance(s, dict) and s.get("package")}


def job_ids(session: Session) -> set[int]:
    return set(session.scalars(select(Job.id)))
