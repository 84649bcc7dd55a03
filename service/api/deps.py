"""Typed dependencies: session, supervisor and settings come from ``app.state`` (``create_app``);
``JobDep`` loads the path's job or answers 404, for every ``/jobs/{job_id}/...`` route, and
``SweepDep`` the path's sweep: a job or sweep of a team the caller does not see answers the same
404 as one that does not exist (``hidden``). ``CallerDep``: who is asking, for the domain.

``reject_unknown_query`` is applied to every route by ``create_app``: a query parameter the route
does not declare is a 422 "unknown field", as an unknown body field is.
"""

from collections.abc import Iterator
from typing import Annotated, get_args, get_origin

from fastapi import Depends, Path, Request
from fastapi.dependencies.models import Dependant
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from service.api.errors import ApiError
from service.api.middleware.auth import get_principal
from service.domain.identity.caller import Caller
from service.domain.loop.supervisor import Supervisor
from service.settings import Settings
from service.store import repository as repo
from service.store import sweeps as sweepstore
from service.store.changefeed import ChangeFeed
from service.store.tables import Job, Sweep

READ_METHODS = frozenset({"GET", "HEAD"})
JOB_ID_MAX = 2**63 - 1  # SQLite's INTEGER PRIMARY KEY


def _factory(request: Request) -> sessionmaker[Session]:
    """The writer's factory; for GET/HEAD the read-only one (GET routes never write).

    Reads on the read-only engine never queue behind metric writes (see ``service.store.db``).
    """
    state = request.app.state
    if request.method in READ_METHODS:
        return getattr(state, "read_session_factory", state.session_factory)
    return state.session_factory


def get_session(request: Request) -> Iterator[Session]:
    with _factory(request)() as session:
        yield session


def get_session_factory(request: Request) -> sessionmaker[Session]:
    """For routes that must not hold one session for their whole life (long polls, streams)."""
    return _factory(request)


def get_read_engine(request: Request) -> Engine:
    """The read-only engine, for the hot GET routes that read through a plain connection
    (a session costs more than their queries)."""
    return request.app.state.read_engine


def get_supervisor(request: Request) -> Supervisor:
    return request.app.state.supervisor


def get_settings(request: Request) -> Settings:
    return request.app.state.settings


def get_changes(request: Request) -> ChangeFeed:
    """Wakes long polls and event streams when a job changes (``service.store.changefeed``)."""
    return request.app.state.changes


JobId = Annotated[int, Path(ge=1, le=JOB_ID_MAX, description="the job's id")]


def hidden(request: Request, what: str, message: str | None = None) -> ApiError:
    """The 404 of another team's ``what``, word for word the one of a missing one
    (``message``, default "<what> not found"); the audit log notes it."""
    request.scope.setdefault("state", {})["hidden"] = True
    return ApiError(404, "not_found", message or f"{what} not found")


def get_caller(request: Request) -> Caller:
    """Who is asking (the routes' rule let only a signed-in user through)."""
    caller = get_principal(request).caller
    if caller is None:
        raise ApiError(403, "forbidden", "a job token may only post records for its own job")
    return caller


def get_job(job_id: JobId, request: Request) -> Job:
    """The job ``job_id`` as it is now, or 404 (also when it is another team's). Read in a
    session of its own that is closed before the route runs (a long poll or a stream holds no
    connection); the row is detached, so read its columns, never reload it."""
    with _factory(request)() as session:
        job = repo.get_job(session, job_id)
    if job is None:
        raise ApiError(404, "not_found", f"job {job_id} not found")
    if not get_principal(request).sees(job.team):
        raise hidden(request, f"job {job_id}")
    return job


SWEEP_ID_MAX = 2**63 - 1
SweepId = Annotated[int, Path(ge=1, le=SWEEP_ID_MAX, description="the sweep's id")]


def get_sweep(sweep_id: SweepId, request: Request) -> Sweep:
    """The sweep, or 404 (also when it is another team's)."""
    with _factory(request)() as session:
        sweep = sweepstore.get_sweep(session, sweep_id)
    if sweep is None:
        raise ApiError(404, "not_found", f"sweep {sweep_id} not found")
    if not get_principal(request).sees(sweep.team):
        raise hidden(request, f"sweep {sweep_id}")
    return sweep


SessionDep = Annotated[Session, Depends(get_session)]
JobDep = Annotated[Job, Depends(get_job)]
SweepDep = Annotated[Sweep, Depends(get_sweep)]
CallerDep = Annotated[Caller, Depends(get_caller)]
SessionFactoryDep = Annotated[sessionmaker[Session], Depends(get_session_factory)]
SupervisorDep = Annotated[Supervisor, Depends(get_supervisor)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
ChangesDep = Annotated[ChangeFeed, Depends(get_changes)]


def _query_params(dependant: Dependant) -> dict[str, bool]:
    """Every query parameter the route declares → whether it may repeat (a list)."""
    params = {p.alias: _is_list(p.field_info.annotation) for p in dependant.query_params}
    for sub in dependant.dependencies:
        params |= _query_params(sub)
    return params


def _is_list(annotation: object) -> bool:
    if get_origin(annotation) in (list, set, frozenset, tuple):
        return True
    return any(_is_list(arg) for arg in get_args(annotation) if get_origin(annotation) is not None)


_DECLARED = "torchyard_query_params"  # the route's own attribute: its parameters, walked once


async def reject_unknown_query(request: Request) -> None:
    """422 for a query parameter the route does not declare ("unknown field"), and for one
    that is not a list but given more than once (which one would count is not in the schema).

    ``async``: it only looks at the request, so it runs on the event loop instead of costing
    every request a hop to the thread pool. A request without a query string (every record
    post) is done at once; the route's parameters are walked once per route."""
    if not request.scope.get("query_string"):
        return
    route = request.scope.get("route")
    if not isinstance(route, APIRoute) or not route.include_in_schema:
        return
    declared = getattr(route, _DECLARED, None)
    if declared is None:
        declared = _query_params(route.dependant)
        setattr(route, _DECLARED, declared)
    unknown = sorted({k for k in request.query_params if k not in declared})
    repeated = sorted({
        k for k in request.query_params
        if k in declared and not declared[k] and len(request.query_params.getlist(k)) > 1
    })
    if unknown or repeated:
        raise RequestValidationError([
            *({"type": "extra_forbidden", "loc": ("query", k), "msg": "unknown field",
               "input": None} for k in unknown),
            *({"type": "value_error", "loc": ("query", k), "msg": "given more than once",
               "input": None} for k in repeated),
        ])
