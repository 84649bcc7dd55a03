"""Worker-facing route: ranks post their metric records with the per-job token."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from service import guard
from service import repository as repo
from service.api.auth import WorkerJobDep
from service.api.deps import JobDep, SessionDep
from service.api.errors import ERROR_RESPONSES
from service.schemas import IngestResult, RecordBatch

router = APIRouter(prefix="/jobs", tags=["workers"])


async def _record_batch(request: Request) -> RecordBatch:
    """The body parsed and validated in one pass by pydantic-core.

    Declaring ``batch: RecordBatch`` would ``json.loads`` the body and then validate the Python
    objects: about twice the CPU on 1000-record batches (docs/benchmarks.md, "ingestion").
    """
    try:
        return RecordBatch.model_validate_json(await request.body())
    except ValidationError as exc:
        raise RequestValidationError(
            [{**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False)]
        ) from None


# The dependency hides the body from FastAPI's document: it is declared here and added to
# ``components`` by ``service.api.openapi``.
BODY_MODELS = (RecordBatch,)
BatchDep = Annotated[RecordBatch, Depends(_record_batch)]


@router.post(
    "/{job_id}/records",
    response_model=IngestResult,
    responses={
        403: {**ERROR_RESPONSES[403], "description": "not this job's token, or the job ended "
              "more than TORCHYARD_WORKER_TOKEN_GRACE_S ago"},
    },
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/RecordBatch"}}},
        }
    },
)
def post_records(
    job_id: WorkerJobDep, job: JobDep, batch: BatchDep, session: SessionDep, request: Request
) -> IngestResult:
    """Store a batch in one transaction; replays of (attempt, rank, epoch, step, name) are ignored.

    Only the job's own token (``Authorization: Bearer``), while the job is starting or running
    and for ``TORCHYARD_WORKER_TOKEN_GRACE_S`` after it ended (a rank's last batch may land just
    after the group exits); the auth middleware enforces this (``service.api.auth``).
    """
    records = [
        repo.RecordIn(r.attempt, r.rank, r.epoch, r.step, r.name, r.value, r.time)  # type: ignore[arg-type]
        for r in batch.records
    ]
    added = repo.insert_records(session, job_id, records)
    if added:
        repo.mark_first_metric(session, job_id, records)
        guard.check(session, job_id, job.spec, records)  # a loss gone bad stops the job
    session.commit()
    request.app.state.telemetry.records_ingested.inc(added)
    return IngestResult(accepted=added, duplicates=len(records) - added)
