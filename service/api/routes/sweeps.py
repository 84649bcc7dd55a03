"""Sweep routes: create, list (cursor), read, its chart series, cancel (docs/sweeps.md). The trials are jobs: the
job routes read and control each one; the sweep driver (``service.domain.sweeps.driver``) makes
them, in the acting supervisor."""

from typing import Annotated

from fastapi import APIRouter, Query, Response

from service.api.deps import SWEEP_ID_MAX, CallerDep, SessionDep, SupervisorDep, SweepDep
from service.api.errors import ERROR_RESPONSES, ApiError
from service.api.middleware.writegate import WriteSlotDep
from service.api.sweepschemas import SweepList, SweepRead, SweepSeries, TrialSeries
from service.domain.sweeps import manage as domain
from service.domain.sweeps.grid import GRID_POINTS_MAX
from service.domain.sweeps.series import sweep_lines
from service.domain.sweeps.spec import SweepSpec
from service.store import sweeps as store
from torchyard_contract.state import SweepStateName

router = APIRouter(prefix="/sweeps", tags=["sweeps"])
SERIES_POINTS_DEFAULT = 500
SERIES_POINTS_MAX = 20_000


@router.post(
    "",
    status_code=201,
    response_model=SweepRead,
    responses={
        403: {**ERROR_RESPONSES[403], "description": "a script sweep on a server without API "
              "tokens or without TORCHYARD_SCRIPT_DIRS"},
        422: {**ERROR_RESPONSES[422], "description": "an invalid sweep (empty space, a field the "
              "job spec does not have, a value of the space the spec refuses, a placeholder "
              f"the space does not define, parallel 0, a grid over {GRID_POINTS_MAX:,} points…) "
              "or trials this server cannot run: whatever POST /jobs refuses of the base spec, "
              "named 'spec.<field>'"},
        507: {**ERROR_RESPONSES[422], "description": "free space under TORCHYARD_HOME is below "
              "TORCHYARD_DISK_FREE_FLOOR_BYTES (as for POST /jobs)"},
    },
)
def create_sweep(
    spec: SweepSpec, response: Response, _write: WriteSlotDep, supervisor: SupervisorDep,
    session: SessionDep, caller: CallerDep,
) -> SweepRead:
    """A sweep of the caller's team: its trials are the caller's jobs."""
    try:
        sweep = supervisor.sweeps.create(spec, caller)
    except domain.SweepRejected as exc:
        message = str(exc)
        raise ApiError(exc.status, exc.kind, message, details=[
            {"field": exc.field, "message": message.removeprefix(f"{exc.field}: ")}]) from exc
    response.headers["Location"] = f"/sweeps/{sweep.id}"
    return SweepRead.from_view(domain.view(session, sweep))


@router.get("", response_model=SweepList)
def list_sweeps(
    session: SessionDep,
    state: SweepStateName | None = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    before: Annotated[
        int | None, Query(ge=1, le=SWEEP_ID_MAX, description="cursor: sweeps with id < before")
    ] = None,
    owner: Annotated[str | None, Query(max_length=64, description="made by this user")] = None,
    team: Annotated[str | None, Query(max_length=64, description="of this team")] = None,
    *,
    caller: CallerDep,
) -> SweepList:
    """Newest first, without their trials; pass ``next_before`` as ``?before=`` for the next
    page. A member or viewer sees only their team's sweeps."""
    sweeps = store.list_sweeps(session, state, limit, before, everyone=caller.admin,
                               caller_team=caller.team, owner=owner, team=team)
    return SweepList(
        items=[SweepRead.from_view(domain.view(session, s), with_trials=False) for s in sweeps],
        next_before=sweeps[-1].id if len(sweeps) == limit else None,
    )


@router.get("/{sweep_id}", response_model=SweepRead)
def get_sweep(sweep: SweepDep, session: SessionDep) -> SweepRead:
    return SweepRead.from_view(domain.view(session, sweep))


@router.get("/{sweep_id}/series", response_model=SweepSeries)
def read_sweep_series(
    found: SweepDep,
    session: SessionDep,
    max_points: Annotated[
        int, Query(ge=16, le=SERIES_POINTS_MAX, description="per trial")
    ] = SERIES_POINTS_DEFAULT,
) -> SweepSeries:
    """The sweep for charts in one read: the sweep (``trials`` empty) and each trial's row with
    its objective per epoch (reduced across ranks, as the sweep judges it), downsampled to at
    most ``max_points`` per trial (first, last and extreme points always kept)."""
    sweep = store.get_sweep(session, found.id)  # SweepDep: 404 for another team's, as for none
    if sweep is None:
        raise ApiError(404, "not_found", f"sweep {found.id} not found")
    v, lines = sweep_lines(session, sweep, max_points)
    return SweepSeries(
        sweep=SweepRead.from_view(v, with_trials=False), max_points=max_points,
        trials=[TrialSeries.from_line(line) for line in lines],
    )


@router.post("/{sweep_id}/cancel", response_model=SweepRead)
def cancel_sweep(
    found: SweepDep, _write: WriteSlotDep, supervisor: SupervisorDep, session: SessionDep,
) -> SweepRead:
    """Cancel a running sweep and its queued and running trials; an ended sweep is returned
    unchanged (200)."""
    sweep = supervisor.sweeps.cancel(found.id)
    if sweep is None:
        raise ApiError(404, "not_found", f"sweep {found.id} not found")
    return SweepRead.from_view(domain.view(session, sweep))
