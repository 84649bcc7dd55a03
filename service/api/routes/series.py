"""Chart routes for the dashboard: a metric as downsampled per-rank lines, and job progress."""

from typing import TYPE_CHECKING, Annotated, Literal

from fastapi import APIRouter, Query
from pydantic import BaseModel, Field

from service.api.deps import JOB_ID_MAX, CallerDep, JobDep, SessionDep
from service.store import repository as repo
from service.store import series
from torchyard_contract.records import MetricValue, decode_value, to_wire
from torchyard_contract.state import JobState

if TYPE_CHECKING:
    from service.domain.records.downsample import Line

router = APIRouter(tags=["dashboard"])
SERIES_POINTS_DEFAULT = 2000
SERIES_POINTS_MAX = 20_000
PROGRESS_JOBS_MAX = 500


class SeriesLine(BaseModel):
    rank: int | None = Field(description="null for the cross-rank mean")
    attempt: int | None = Field(description="null for the cross-rank mean")
    x: list[int] = Field(description="epoch, or step for level=step")
    y: list[MetricValue]
    points: int = Field(description="points before downsampling")


class AttemptStart(BaseModel):
    number: int
    first_x: int = Field(description="smallest x any rank reported in this attempt")


class SeriesPage(BaseModel):
    job_id: int
    state: JobState
    name: str
    level: Literal["epoch", "step"]
    max_points: int
    last_seq: int = Field(description="the job's newest record when read; 0 when none")
    names: list[str] = Field(description="every metric name the job has reported")
    lines: list[SeriesLine] = Field(description="one per (rank, attempt), by rank then attempt")
    mean: SeriesLine = Field(description="mean across ranks at each x (latest attempt wins)")
    attempts: list[AttemptStart]


class Progress(BaseModel):
    job_id: int
    last_seq: int = Field(description="newest record's seq; 0 when none")
    epoch: int | None = Field(description="epoch of the newest record: the latest epoch reported")


class ProgressList(BaseModel):
    items: list[Progress]


def _line(line: "Line") -> SeriesLine:
    y = [to_wire(v) for v in line.y]
    return SeriesLine(rank=line.rank, attempt=line.attempt, x=line.x, y=y, points=line.points)


@router.get("/jobs/{job_id}/series", response_model=SeriesPage)
def read_series(
    job: JobDep,
    session: SessionDep,
    name: Annotated[str, Query(min_length=1, max_length=64)] = "loss",
    level: Annotated[Literal["epoch", "step"], Query(description="per-epoch or per-step")] = "epoch",
    max_points: Annotated[int, Query(ge=16, le=SERIES_POINTS_MAX)] = SERIES_POINTS_DEFAULT,
) -> SeriesPage:
    """One metric of a job for charts: a line per (rank, attempt) plus the cross-rank mean, each
    downsampled to at most ``max_points`` (first, last and extreme points always kept)."""
    # Imported on the first chart read, not at start-up: numpy and tsdownsample are ~0.15 CPU s
    # of every server start, which most servers (and every ``--workers`` process) never use.
    from service.domain.records.downsample import build_lines

    job_id = job.id
    state = JobState(job.state)
    # Read the cursor before the rows: a record stored in between is in the rows and makes the
    # next progress poll look newer, so the client re-reads once; it is never missed.
    last = series.last_record(session, job_id)
    rows = series.series_rows(session, job_id, name, steps=level == "step")
    attempt, rank, epoch, step, value, nonfinite = zip(*rows, strict=True) if rows else ((),) * 6
    values = [decode_value(n) if n else v for v, n in zip(value, nonfinite, strict=True)]
    x = step if level == "step" else epoch
    lines, mean = build_lines(attempt, rank, x, values, max_points)
    first_x: dict[int, int] = {}
    for line in lines:
        if line.x and line.attempt is not None:
            first_x[line.attempt] = min(first_x.get(line.attempt, line.x[0]), line.x[0])
    return SeriesPage(
        job_id=job_id, state=state, name=name, level=level, max_points=max_points,
        last_seq=last[0] if last else 0, names=series.metric_names(session, job_id),
        lines=[_line(line) for line in lines], mean=_line(mean),
        attempts=[AttemptStart(number=n, first_x=x) for n, x in sorted(first_x.items())],
    )


@router.get("/progress", response_model=ProgressList)
def read_progress(
    session: SessionDep,
    caller: CallerDep,
    job_id: Annotated[
        list[Annotated[int, Field(ge=1, le=JOB_ID_MAX)]],
        Query(max_length=PROGRESS_JOBS_MAX, description="repeatable"),
    ],
) -> ProgressList:
    """Newest record (seq, epoch) of each listed job: one indexed lookup per job. Unknown ids
    come back with ``last_seq`` 0, like jobs that reported nothing yet (and so do other
    teams' jobs)."""
    items = []
    ids = list(dict.fromkeys(job_id))
    teams = repo.teams_of_jobs(session, ids) if not caller.admin else {}
    for jid in ids:
        last = series.last_record(session, jid) if caller.admin or (
            jid in teams and caller.sees(teams[jid])) else None
        items.append(Progress(job_id=jid, last_seq=last[0] if last else 0,
                              epoch=last[1] if last else None))
    return ProgressList(items=items)
