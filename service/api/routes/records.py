"""Worker-facing route: ranks post their metric records with the per-job token.

A job token is shared by the job's ranks (they share a Unix user, environment and run directory,
so a token per rank would not keep one rank from posting as another). What the token can post is
bounded by what the job is (``service.domain.records.scope``, docs/security.md): a batch naming a rank or
attempt the job does not have is refused whole (422); one naming the next attempt before the
server has recorded it is 503 with ``Retry-After`` (the rank's reporter retries); a batch for a
job that is over is 409 (docs/metrics.md: nothing is stored after the terminal state). A batch
that cannot get its lock (SQLite's write lock, the job's record lock on PostgreSQL) within
``TORCHYARD_DB_LOCK_TIMEOUT_S``, or finds every write slot of the process taken for that long
(``service.api.middleware.writegate``), is 503 with ``Retry-After`` too: nothing of it is stored, and the
reporter's retry lands it once.
"""

from datetime import timedelta
from typing import Annotated

from fastapi import APIRouter, Depends, Request, Response
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from service.api.errors import ERROR_RESPONSES, RETRY_LATER, ApiError
from service.api.middleware.auth import WorkerJobDep, job_token_digest, job_token_refusal
from service.api.middleware.writegate import WriteGate
from service.api.recordschemas import IngestResult, RecordBatch, parse_record_batch
from service.domain.records.ingest import RecordsRefused, accept_records
from service.store import records as recordstore
from service.store.clock import utcnow
from service.store.records import RecordIn

router = APIRouter(prefix="/jobs", tags=["workers"])


async def _record_batch(request: Request) -> list[RecordIn]:
    """The body parsed and validated by pydantic-core straight from the bytes
    (``parse_record_batch``: one strict pass; a body it refuses is parsed again by
    ``RecordBatch``, which decides and words the error).

    Declaring ``batch: RecordBatch`` would ``json.loads`` the body and then validate the Python
    objects: about three times the CPU on 1000-record batches (docs/benchmarks.md).
    """
    try:
        return parse_record_batch(await request.body())
    except ValidationError as exc:
        raise RequestValidationError(
            [{**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False)]
        ) from None


# The dependency hides the body from FastAPI's document: it is declared here and added to
# ``components`` by ``service.api.openapi``.
BODY_MODELS = (RecordBatch,)
BatchDep = Annotated[list[RecordIn], Depends(_record_batch)]


@router.post(
    "/{job_id}/records",
    response_model=IngestResult,
    responses={
        403: {**ERROR_RESPONSES[403], "description": "not this job's token, or the job ended "
              "more than TORCHYARD_WORKER_TOKEN_GRACE_S ago"},
        409: {**ERROR_RESPONSES[409], "description": "the job is over: nothing is stored after "
              "its end (the rank's spool file keeps the records)"},
        422: {**ERROR_RESPONSES[422], "description": "an invalid record, or a rank or attempt "
              "the job does not have"},
        **RETRY_LATER,
    },
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/RecordBatch"}}},
        }
    },
)
async def post_records(
    job_id: WorkerJobDep, records: BatchDep, request: Request,
) -> Response:
    """Store a batch in one transaction; replays of (attempt, rank, epoch, step, name) are ignored.

    Only the job's own token (``Authorization: Bearer``; ``service.api.auth``), and only while
    the job is starting or running: a batch that arrives once the job is terminal is 409 (the
    token is still recognised for ``TORCHYARD_WORKER_TOKEN_GRACE_S``, so a late rank learns
    why). Nothing a rank reported is lost by this: the server ingests every rank's spool before
    a job that ended by itself turns terminal (docs/metrics.md).
    """
    # ``async`` with the database part in one call on the thread pool: the body was parsed on
    # the event loop, and the sync route with a session dependency cost three more hops. The
    # write slot is taken once the body is read (service.api.middleware.writegate).
    state = request.app.state
    grace = timedelta(seconds=state.settings.worker_token_grace_s)
    gate: WriteGate = state.record_gate
    await gate.acquire()
    try:
        added = await run_in_threadpool(_store_batch, state.session_factory, job_id,
                                        job_token_digest(request), grace, records)
    finally:
        gate.release()
    state.telemetry.records_ingested.inc(added)
    result = IngestResult(accepted=added, duplicates=len(records) - added)
    return Response(result.model_dump_json(), media_type="application/json")


def _store_batch(factory: sessionmaker[Session], job_id: int, digest: str, grace: timedelta,
                 records: list[RecordIn]) -> int:
    """The batch stored in one write transaction; how many records were new."""
    with factory() as session:
        # Read inside this write transaction: writer sessions hold the write lock from their
        # first statement on SQLite (service.store.db), so the state read here cannot turn
        # terminal before this batch commits. The token is checked again on this row: the
        # middleware may have let it through on its memory of an earlier batch.
        job = recordstore.job_for_records(session, job_id)
        refused_token = job_token_refusal(job_id, job, digest, utcnow(), grace)
        if refused_token is not None or job is None:
            raise ApiError(403, "forbidden", refused_token or "")
        try:
            added = accept_records(session, job, records, refuse_whole=True)
        except RecordsRefused as exc:
            refused = exc.refusal
            headers = {"Retry-After": "1"} if refused.status == 503 else None
            error = {409: "conflict", 503: "unavailable"}.get(refused.status, "invalid_request")
            message = f"{refused.field}: {refused.message}" if refused.field else refused.message
            raise ApiError(refused.status, error, message, headers) from None
        session.commit()
    return added
