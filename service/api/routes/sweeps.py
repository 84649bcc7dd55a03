"""Sweep routes: create, list (cursor), read, its chart series, cancel (docs/sweeps.md). The trials are jobs: the
job routes read and control each one; the sweep driver (``service.domain.sweeps.driver``) makes
them, in the acting supervisor."""

from typing import Annotated, Literal

from fastapi import APIRouter, Path, Query, Response

from service.api.deps import SessionDep, SupervisorDep
from service.api.errors import ERROR_RESPONSES, ApiError
from service.api.middleware.writegate import WriteSlotDep
from service.api.sweepschemas import SweepList, SweepRead, SweepSeries, TrialSeries
from service.domain.intake.submission import SubmitRejected
from service.domain.sweeps import manage as domain
from service.domain.sweeps.series import sweep_lines
from service.domain.sweeps.spec import SweepSpec
from service.store import sweeps as store

router = APIRouter(prefix="/sweeps", tags=["sweeps"])
SWEEP_ID_MAX = 2**63 - 1
SweepId = Annotated[int, Path(ge=1, le=SWEEP_ID_MAX)]
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
              "the space does not define, parallel 0…) or trials this server cannot run"},
    },
)
def create_sweep(
    spec: SweepSpec, response: Response, _write: WriteSlotDep, supervisor: SupervisorDep,
    session: SessionDep,
) -> SweepRead:
    try:
        sweep = supervisor.sweeps.create(spec)
    except SubmitRejected as exc:
        raise ApiError(exc.status, exc.kind, str(exc)) from exc
    response.headers["Location"] = f"/sweeps/{sweep.id}"
    return SweepRead.from_view(domain.view(session, sweep))


@router.get("", response_model=SweepList)
def list_sweeps(
    session: SessionDep,
    state: Literal["running", "succeeded", "failed", "cancelled"] | None = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    before: Annotated[
        int | None, Query(ge=1, le=SWEEP_ID_MAX, description="cursor: sweeps with id < before")
    ] = None,
) -> SweepList:
    """Newest first, without their trials; pass ``next_before`` as ``?before=`` for the next
    page."""
    sweeps = store.list_sweeps(session, state, limit, before)
    return SweepList(
        items=[SweepRead.from_view(domain.view(session, s), with_trials=False) for s in sweeps],
        next_before=sweeps[-1].id if len(sweeps) == limit else None,
    )


@router.get("/{sweep_id}", response_model=SweepRead)
def get_sweep(sweep_id: SweepId, session: SessionDep) -> SweepRead:
    sweep = store.get_sweep(session, sweep_id)
    if sweep is None:
        raise ApiError(404, "not_found", f"sweep {sweep_id} not found")
    return SweepRead.from_view(domain.view(session, sweep))


@router.get("/{sweep_id}/series", response_model=SweepSeries)
def read_sweep_series(
    sweep_id: SweepId,
    session: SessionDep,
    max_points: Annotated[
        int, Query(ge=16, le=SERIES_POINTS_MAX, description="per trial")
    ] = SERIES_POINTS_DEFAULT,
) -> SweepSeries:
    """The sweep for charts in one read: the sweep (``trials`` empty) and each trial's row with
    its objective per epoch (reduced across ranks, as the sweep judges it), downsampled to at
    most ``max_points`` per trial (first, last and extreme points always kept)."""
    sweep = store.get_sweep(session, sweep_id)
    if sweep is None:
        raise ApiError(404, "not_found", f"sweep {sweep_id} not found")
    v, lines = sweep_lines(session, sweep, max_points)
    return SweepSeries(
        sweep=SweepRead.from_view(v, with_trials=False), max_points=max_points,
        trials=[TrialSeries.from_line(line) for line in lines],
    )


@router.post("/{sweep_id}/cancel", response_model=SweepRead)
def cancel_sweep(
    sweep_id: SweepId, _write: WriteSlotDep, supervisor: SupervisorDep, session: SessionDep,
) -> SweepRead:
    """Cancel a running sweep and its queued and running trials; an ended sweep is returned
    unchanged (200)."""
    sweep = supervisor.sweeps.cancel(sweep_id)
    if sweep is None:
        raise ApiError(404, "not_found", f"sweep {sweep_id} not found")
    return SweepRead.from_view(domain.view(session, sweep))
