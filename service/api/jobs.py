"""Job routes: submit, read, list, cancel, and read metrics with a cursor."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response

from service import repository as repo
from service.api.deps import SessionDep, SupervisorDep
from service.api.errors import ApiError
from service.schemas import AttemptRead, JobList, JobRead, MetricRead, MetricsPage
from service.spec import JobSpec
from service.state import JobState
from service.supervisor import SubmitRejected

router = APIRouter(prefix="/jobs", tags=["jobs"])
METRICS_PAGE_DEFAULT = 1000
METRICS_PAGE_MAX = 10_000


def _job_or_404(session: SessionDep, job_id: int):  # type: ignore[no-untyped-def]
    job = repo.get_job(session, job_id)
    if job is None:
        raise ApiError(404, "not_found", f"job {job_id} not found")
    return job


@router.post("", status_code=201, response_model=JobRead)
def submit_job(spec: JobSpec, response: Response, supervisor: SupervisorDep) -> JobRead:
    try:
        job = supervisor.submit(spec)
    except SubmitRejected as exc:
        raise ApiError(exc.status, exc.kind, str(exc)) from exc
    response.headers["Location"] = f"/jobs/{job.id}"
    return JobRead.from_row(job)


@router.get("", response_model=JobList)
def list_jobs(
    session: SessionDep,
    state: JobState | None = None,
    name: Annotated[str | None, Query(max_length=100)] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    before: Annotated[int | None, Query(ge=1, description="cursor: jobs with id < before")] = None,
) -> JobList:
    jobs = repo.list_jobs(session, state, name, limit, before)
    next_before = jobs[-1].id if len(jobs) == limit else None
    return JobList(items=[JobRead.from_row(j) for j in jobs], next_before=next_before)


@router.get("/{job_id}", response_model=JobRead)
def get_job(job_id: int, session: SessionDep) -> JobRead:
    return JobRead.from_row(_job_or_404(session, job_id))


@router.get("/{job_id}/attempts", response_model=list[AttemptRead])
def get_attempts(job_id: int, session: SessionDep) -> list[AttemptRead]:
    """Every attempt of the job: number, start/end (Unix s), exit code, failure reason."""
    return JobRead.from_row(_job_or_404(session, job_id)).attempts


@router.post("/{job_id}/cancel", response_model=JobRead)
def cancel_job(job_id: int, supervisor: SupervisorDep) -> JobRead:
    """Cancel a queued or running job; cancelling a finished job returns it unchanged (200)."""
    job = supervisor.cancel(job_id)
    if job is None:
        raise ApiError(404, "not_found", f"job {job_id} not found")
    return JobRead.from_row(job)


@router.get("/{job_id}/metrics", response_model=MetricsPage)
def read_metrics(
    job_id: int,
    session: SessionDep,
    after: Annotated[int, Query(ge=0, description="return records with seq > after")] = 0,
    limit: Annotated[int, Query(ge=1, le=METRICS_PAGE_MAX)] = METRICS_PAGE_DEFAULT,
    rank: Annotated[int | None, Query(ge=0, le=65_535)] = None,
    name: Annotated[str | None, Query(max_length=64)] = None,
) -> MetricsPage:
    # Read the state first: a record stored after this read is still returned next tick,
    # so a poller that sees a terminal state and then an empty page has seen everything.
    job = _job_or_404(session, job_id)
    state = JobState(job.state)
    rows = repo.read_records(session, job_id, after, limit, rank, name)
    items = [MetricRead.from_row(r) for r in rows]
    return MetricsPage(
        job_id=job_id, state=state, items=items, next_after=items[-1].seq if items else after
    )
