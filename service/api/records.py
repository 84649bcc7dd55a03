"""Worker-facing route: ranks post their metric records with the per-job token."""

from __future__ import annotations

from fastapi import APIRouter, Request

from service import repository as repo
from service.api.auth import WorkerJobDep
from service.api.deps import SessionDep
from service.api.errors import ApiError
from service.schemas import IngestResult, RecordBatch

router = APIRouter(prefix="/jobs", tags=["workers"])


@router.post("/{job_id}/records", response_model=IngestResult)
def post_records(
    job_id: WorkerJobDep, batch: RecordBatch, session: SessionDep, request: Request
) -> IngestResult:
    """Store a batch in one transaction; replays of (attempt, rank, epoch, step, name) are ignored.

    Only the job's own token (``Authorization: Bearer``), while the job is starting or running
    and for ``TORCHYARD_WORKER_TOKEN_GRACE_S`` after it ended (a rank's last batch may land just
    after the group exits); the auth middleware enforces this (``service.api.auth``).
    """
    if repo.get_job(session, job_id) is None:
        raise ApiError(404, "not_found", f"job {job_id} not found")
    records = [
        repo.RecordIn(r.attempt, r.rank, r.epoch, r.step, r.name, r.value, r.time)  # type: ignore[arg-type]
        for r in batch.records
    ]
    added = repo.insert_records(session, job_id, records)
    if added:
        repo.mark_first_metric(session, job_id, records)
    session.commit()
    request.app.state.telemetry.records_ingested.inc(added)
    return IngestResult(accepted=added, duplicates=len(records) - added)
