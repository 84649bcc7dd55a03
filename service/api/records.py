"""Worker-facing route: ranks post their metric records with the per-job token.

A job token is shared by the job's ranks (they share a Unix user, environment and run directory,
so a token per rank would not keep one rank from posting as another). What the token can post is
bounded by what the job is (docs/security.md): ranks ``0 .. world size - 1`` and attempts that
exist. A batch naming another rank or attempt is refused whole (422); one naming the attempt the
server has not seen start yet (it learns of it within a supervisor tick) is 503 with
``Retry-After``, which the rank's reporter retries.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from service import repository as repo
from service.api.auth import WorkerJobDep
from service.api.deps import SessionDep
from service.api.errors import RETRY_LATER, ApiError
from service.models import Job
from service.schemas import IngestResult, RecordBatch
from service.state import ACTIVE_STATES, JobState

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


# Documented as before (the dependency hides the body from OpenAPI); OpenAPI 3.1 takes $defs.
_BODY_SCHEMA = RecordBatch.model_json_schema()
BatchDep = Annotated[RecordBatch, Depends(_record_batch)]


@router.post(
    "/{job_id}/records",
    response_model=IngestResult,
    responses=RETRY_LATER,
    openapi_extra={
        "requestBody": {"required": True, "content": {"application/json": {"schema": _BODY_SCHEMA}}}
    },
)
def post_records(
    job_id: WorkerJobDep, batch: BatchDep, session: SessionDep, request: Request
) -> IngestResult:
    """Store a batch in one transaction; replays of (attempt, rank, epoch, step, name) are ignored.

    Only the job's own token (``Authorization: Bearer``), while the job is starting or running
    and for ``TORCHYARD_WORKER_TOKEN_GRACE_S`` after it ended (a rank's last batch may land just
    after the group exits); the auth middleware enforces this (``service.api.auth``).
    """
    job = repo.get_job(session, job_id)
    if job is None:
        raise ApiError(404, "not_found", f"job {job_id} not found")
    _check_ranks_and_attempts(job, batch)
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


class AttemptNotStarted(ApiError):
    """The attempt after an ended one, which the supervisor has not recorded yet: retry."""

    def __init__(self, job_id: int, attempt: int) -> None:
        super().__init__(503, "unavailable",
                         f"job {job_id}: attempt {attempt} has not started yet; retry",
                         headers={"Retry-After": "1"})


def world_size(job: Job) -> int:
    """Ranks of the job: ``nproc_per_node`` times ``nnodes`` (1 unless the spec has it)."""
    spec = job.spec or {}
    return int(spec.get("nproc_per_node", 1)) * int(spec.get("nnodes", 1) or 1)


def _check_ranks_and_attempts(job: Job, batch: RecordBatch) -> None:
    """Refuse records of ranks or attempts the job does not have (see the module docstring).

    Attempts: before any is recorded only attempt 1 can be running (a token exists only from
    launch); after that, the recorded ones, and the next one only once the latest has ended
    (503 until the supervisor records it)."""
    ranks = world_size(job)
    recorded = {int(a["number"]): a for a in job.attempts or [] if "number" in a}
    latest = max(recorded, default=0)
    allowed = set(recorded) or {1}
    latest_ended = latest and recorded[latest].get("ended_at") is not None
    active = JobState(job.state) in ACTIVE_STATES
    for index, record in enumerate(batch.records):
        if record.rank >= ranks:
            raise ApiError(422, "invalid_request",
                           f"records.{index}.rank: job {job.id} has ranks 0..{ranks - 1}; "
                           f"got {record.rank}")
        if record.attempt in allowed:
            continue
        if active and latest_ended and record.attempt == latest + 1:
            raise AttemptNotStarted(job.id, record.attempt)
        raise ApiError(422, "invalid_request",
                       f"records.{index}.attempt: job {job.id} has attempts "
                       f"{', '.join(map(str, sorted(allowed)))}; got {record.attempt}")
