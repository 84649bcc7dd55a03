"""Job routes: submit, read, list, wait, cancel, pause, resume, and read metrics with a cursor."""

import time
from collections.abc import Callable
from typing import Annotated

from fastapi import APIRouter, Header, Query, Request, Response
from pydantic import StringConstraints
from pydantic_core import to_json
from sqlalchemy import Engine
from starlette.concurrency import run_in_threadpool

from service.api.deps import (
    JOB_ID_MAX,
    CallerDep,
    ChangesDep,
    JobDep,
    JobId,
    SessionDep,
    SessionFactoryDep,
    SupervisorDep,
    get_read_engine,
    hidden,
)
from service.api.drain import draining
from service.api.errors import ERROR_RESPONSES, ApiError
from service.api.hotreads import HotReads
from service.api.middleware.auth import get_principal
from service.api.middleware.writegate import WriteSlotDep
from service.api.recordschemas import MetricsPage, metric_item
from service.api.schemas import AttemptRead, JobList, JobRead, MlflowExportRead
from service.domain.files.cleanup import JobLive, JobNotFound
from service.domain.intake.submission import SubmitRejected
from service.domain.loop.pauses import PauseRefused
from service.domain.loop.supervisor import Supervisor
from service.domain.tracking.view import mlflow_export
from service.store import records as recordstore
from service.store import repository as repo
from service.store.tables import Job
from torchyard_contract.spec import JobSpec
from torchyard_contract.spec_types import LABEL_VALUE_CHARS, LABEL_VALUE_MAX
from torchyard_contract.state import TERMINAL_STATES, JobState

router = APIRouter(prefix="/jobs", tags=["jobs"])
METRICS_PAGE_DEFAULT = 1000
METRICS_PAGE_MAX = 10_000
SEQ_MAX = 2**63 - 1  # record seq: SQLite's INTEGER PRIMARY KEY
WAIT_DEFAULT_S = 30.0
WAIT_MAX_S = 300.0
# Woken by the change feed; this poll only covers writers in other processes on SQLite.
WAIT_POLL_S = 0.25
LABEL_FILTER = (
    rf"^[A-Za-z0-9][A-Za-z0-9._/-]{{0,62}}(=(?:{LABEL_VALUE_CHARS}){{0,{LABEL_VALUE_MAX}}})?$"
)
IDEMPOTENCY_KEY = r"^[\x21-\x7e]{1,200}$"


@router.post(
    "",
    status_code=201,
    response_model=JobRead,
    responses={
        200: {"model": JobRead, "description": "repeated Idempotency-Key: the first job"},
        # Refusals that depend on this server's settings or state, not only on the spec:
        403: {**ERROR_RESPONSES[403], "description": "a script job (entrypoint) on a server "
              "without API tokens or without TORCHYARD_SCRIPT_DIRS"},
        409: {**ERROR_RESPONSES[409], "description": "the Idempotency-Key was used with "
              "another spec"},
        422: {**ERROR_RESPONSES[422], "description": "an invalid spec; or a valid one this "
              "server cannot run: nproc_per_node more than this host has, dataset_root outside "
              "TORCHYARD_DATA_DIRS, entrypoint not a file in the script directories, "
              "resume_from naming no job, secret_env naming a secret the server does not hold, "
              "nnodes > 1 or a Slurm field (partition, account, qos, constraint) on the local "
              "executor"},
    },
)
def submit_job(
    spec: JobSpec,
    response: Response,
    _write: WriteSlotDep,
    supervisor: SupervisorDep,
    caller: CallerDep,
    idempotency_key: Annotated[
        str | None,
        Header(
            pattern=IDEMPOTENCY_KEY,
            description="a retried POST with the same key returns the first job (200), never a "
            "second one; the same key with a different spec is 409",
        ),
    ] = None,
) -> JobRead:
    try:
        job, created = supervisor.submit(spec, idempotency_key, caller)
    except SubmitRejected as exc:
        raise ApiError(exc.status, exc.kind, str(exc)) from exc
    response.headers["Location"] = f"/jobs/{job.id}"
    if not created:
        response.status_code = 200
    return _job_read(job, supervisor)


@router.get("", response_model=JobList)
def list_jobs(
    session: SessionDep,
    supervisor: SupervisorDep,
    state: JobState | None = None,
    name: Annotated[str | None, Query(max_length=100)] = None,
    label: Annotated[
        list[Annotated[str, StringConstraints(pattern=LABEL_FILTER)]],
        Query(
            max_length=16,
            description="repeatable; 'key=value' or 'key' (has the label); all must match",
        ),
    ] = [],  # noqa: B006 - FastAPI copies query defaults
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    before: Annotated[
        int | None, Query(ge=1, le=JOB_ID_MAX, description="cursor: jobs with id < before")
    ] = None,
    owner: Annotated[str | None, Query(max_length=64, description="submitted by this user")] = None,
    team: Annotated[str | None, Query(max_length=64, description="of this team")] = None,
    *,
    caller: CallerDep,
) -> JobList:
    """Newest first; pass ``next_before`` as ``?before=`` for the next page. A member or viewer
    sees only their team's jobs; an admin sees every job (those older than teams too)."""
    labels = []
    for item in label:  # each matches LABEL_FILTER (checked with the other parameters)
        key, sep, value = item.partition("=")
        labels.append((key, value if sep else None))
    jobs = repo.list_jobs(session, state, name, limit, before, labels, everyone=caller.admin,
                          caller_team=caller.team, owner=owner, team=team)
    next_before = jobs[-1].id if len(jobs) == limit else None
    return JobList(
        items=[_job_read(j, supervisor) for j in jobs],
        next_before=next_before,
    )


@router.get("/{job_id}", response_model=JobRead)
def get_job(job: JobDep, supervisor: SupervisorDep, session: SessionDep) -> JobRead:
    """The job, with its MLflow export when it has one (``mlflow``)."""
    read = _job_read(job, supervisor)
    export = mlflow_export(session, job.id)
    if export is not None:
        read.mlflow = MlflowExportRead(run_id=export.run_id, experiment=export.experiment,
                                       state=export.state)
    return read


def _job_read(job: Job, supervisor: Supervisor) -> JobRead:
    """The job; a queued one with its place in the queue. Only for queued jobs is the queue
    looked up (off the supervisor, it may read the published snapshot: a query at most once a
    second per process, see ``service.domain.queue.snapshot``)."""
    queued = job.state == JobState.queued.value
    return JobRead.from_row(job, supervisor.queue_status(job.id) if queued else None)


@router.get("/{job_id}/wait", response_model=JobRead)
async def wait_for_job(
    job: JobDep,
    request: Request,
    session_factory: SessionFactoryDep,
    supervisor: SupervisorDep,
    changes: ChangesDep,
    timeout: Annotated[float, Query(ge=0, le=WAIT_MAX_S, allow_inf_nan=False)] = WAIT_DEFAULT_S,
) -> JobRead:
    """Long-poll: answers as soon as the job is terminal, or after ``timeout`` seconds (or when
    the server shuts down) with the job as it is then (check ``state``). Never an error for a
    job that is still running."""
    deadline = time.monotonic() + timeout
    stopping = draining(request)
    while True:
        seen = changes.version(job.id)
        done = JobState(job.state) in TERMINAL_STATES or time.monotonic() >= deadline
        if done or stopping.is_set():
            # Off the event loop: the queue lookup may read the database.
            return await run_in_threadpool(_job_read, job, supervisor)
        left = max(0.0, deadline - time.monotonic())
        await changes.wait(job.id, seen, min(changes.fallback_s(WAIT_POLL_S), left))
        job = await run_in_threadpool(_read_job, session_factory, job.id)


def _read_job(session_factory: SessionFactoryDep, job_id: int) -> Job:
    # A short session per poll: a waiter holds no connection while it sleeps.
    with session_factory() as session:
        job = repo.get_job(session, job_id)
    if job is None:
        raise ApiError(404, "not_found", f"job {job_id} not found")
    return job


@router.get("/{job_id}/attempts", response_model=list[AttemptRead])
def get_attempts(job: JobDep) -> list[AttemptRead]:
    """Every attempt of the job: number, start/end (Unix s), exit code, failure reason."""
    return JobRead.from_row(job).attempts


@router.post("/{job_id}/cancel", response_model=JobRead)
def cancel_job(_write: WriteSlotDep, job: JobDep, supervisor: SupervisorDep) -> JobRead:
    """Cancel a queued or running job; cancelling a finished job returns it unchanged (200)."""
    cancelled = supervisor.cancel(job.id) or job  # None: deleted meanwhile; answer what we read
    return _job_read(cancelled, supervisor)


_PAUSE_CONFLICT = {409: {**ERROR_RESPONSES[409], "description": "the job is in a state that "
                   "cannot be paused or resumed (the message names it)"}}


@router.post("/{job_id}/pause", response_model=JobRead, responses=_PAUSE_CONFLICT)
def pause_job(_write: WriteSlotDep, job: JobDep, supervisor: SupervisorDep) -> JobRead:
    """Pause a job: a queued one is ``paused`` at once; a starting or running one is
    ``pausing`` while its ranks stop at a safe point with a checkpoint (SIGTERM, then the spec's
    ``pause_grace_s``), then ``paused`` with its resources free. A paused or pausing job is
    returned unchanged (200); a finished one is 409. Resume it with ``/resume``."""
    try:
        paused = supervisor.pause(job.id) or job
    except PauseRefused as exc:
        raise ApiError(409, "conflict", str(exc)) from None
    return _job_read(paused, supervisor)


@router.post("/{job_id}/resume", response_model=JobRead, responses=_PAUSE_CONFLICT)
def resume_job(_write: WriteSlotDep, job: JobDep, supervisor: SupervisorDep) -> JobRead:
    """Queue a paused job again; when it runs it goes on from its last checkpoint as a new
    attempt (no restart used). Any other state is 409 (a pausing job: once it is paused)."""
    try:
        resumed = supervisor.resume(job.id) or job
    except PauseRefused as exc:
        raise ApiError(409, "conflict", str(exc)) from None
    return _job_read(resumed, supervisor)


@router.delete(
    "/{job_id}",
    status_code=204,
    response_class=Response,
    responses={
        404: {**ERROR_RESPONSES[404], "description": "no such job (or it was deleted already)"},
        409: {**ERROR_RESPONSES[409], "description": "the job is queued or running: cancel it "
              "first"},
    },
)
def delete_job(job: JobDep, _write: WriteSlotDep, supervisor: SupervisorDep) -> Response:
    """Delete a finished job with everything it left: its records, labels, logs, run
    directory, checkpoints and outputs (and, with webhooks, its deliveries). Nothing of it
    remains; its id answers 404 from then on."""
    try:
        supervisor.delete(job.id)
    except JobNotFound as exc:
        raise ApiError(404, "not_found", str(exc)) from exc
    except JobLive as exc:
        raise ApiError(409, "conflict", str(exc)) from exc
    return Response(status_code=204)


@router.get("/{job_id}/metrics", response_model=MetricsPage)
async def read_metrics(
    job_id: JobId,
    request: Request,
    after: Annotated[
        int, Query(ge=0, le=SEQ_MAX, description="return records with seq > after")
    ] = 0,
    limit: Annotated[int, Query(ge=1, le=METRICS_PAGE_MAX)] = METRICS_PAGE_DEFAULT,
    rank: Annotated[int | None, Query(ge=0, le=65_535)] = None,
    name: Annotated[str | None, Query(max_length=64)] = None,
) -> Response:
    # The hottest read (every dashboard polls it): one hop to the thread pool (bounded, see
    # service.api.hotreads), one plain connection, the job's state as one column, the page
    # serialized once (docs/benchmarks.md §7).
    engine = get_read_engine(request)
    reads: HotReads = request.app.state.hot_reads
    sees = get_principal(request).sees
    body = await reads.run(_metrics_page, engine, job_id, after, limit, rank, name, sees)
    if body is None:
        raise hidden(request, f"job {job_id}")
    return Response(body, media_type="application/json")


def _metrics_page(
    engine: Engine, job_id: int, after: int, limit: int, rank: int | None, name: str | None,
    sees: Callable[[str | None], bool],
) -> bytes | None:
    """The page; None for a job of a team the caller does not see."""
    with engine.connect() as conn:  # one read transaction, rolled back on close
        # The state first: a record stored after this read is still returned next time, so a
        # poller that sees a terminal state and then an empty page has seen everything.
        found = repo.job_state_and_team(conn, job_id)
        if found is None:
            raise ApiError(404, "not_found", f"job {job_id} not found")
        state, team = found
        if not sees(team):
            return None
        rows = recordstore.read_records(conn, job_id, after, limit, rank, name)
    # A MetricsPage, serialized here: returning the model would make FastAPI dump it,
    # validate it again against response_model and then serialize (3 passes over up to 10,000
    # items); the items as plain dicts, without a model each (recordschemas.metric_item).
    return to_json({
        "job_id": job_id, "state": JobState(state).value,
        "items": [metric_item(r) for r in rows],  # type: ignore[arg-type]
        "next_after": rows[-1].seq if rows else after,
    })