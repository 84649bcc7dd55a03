"""Typed dependencies: session, supervisor and settings come from ``app.state`` (``create_app``).

``reject_unknown_query`` is applied to every route by ``create_app``: a query parameter the route
does not declare is a 422 "unknown field", as an unknown body field is.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Request
from fastapi.dependencies.models import Dependant
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from sqlalchemy.orm import Session, sessionmaker

from service.changefeed import ChangeFeed
from service.settings import Settings
from service.supervisor import Supervisor

READ_METHODS = frozenset({"GET", "HEAD"})


def _factory(request: Request) -> sessionmaker[Session]:
    """The writer's factory; for GET/HEAD the read-only one (GET routes never write).

    Reads on the read-only engine never queue behind metric writes (see ``service.db``).
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


def get_supervisor(request: Request) -> Supervisor:
    return request.app.state.supervisor


def get_settings(request: Request) -> Settings:
    return request.app.state.settings


def get_changes(request: Request) -> ChangeFeed:
    """Wakes long polls and event streams when a job changes (``service.changefeed``)."""
    return request.app.state.changes


SessionDep = Annotated[Session, Depends(get_session)]
SessionFactoryDep = Annotated[sessionmaker[Session], Depends(get_session_factory)]
SupervisorDep = Annotated[Supervisor, Depends(get_supervisor)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
ChangesDep = Annotated[ChangeFeed, Depends(get_changes)]


def _query_names(dependant: Dependant) -> set[str]:
    names = {p.alias for p in dependant.query_params}
    for sub in dependant.dependencies:
        names |= _query_names(sub)
    return names


def reject_unknown_query(request: Request) -> None:
    route = request.scope.get("route")
    if not isinstance(route, APIRoute):
        return
    declared = _query_names(route.dependant)  # a walk of a few nodes: cheaper than caching
    unknown = sorted({k for k in request.query_params if k not in declared})
    if unknown:
        raise RequestValidationError([
            {"type": "extra_forbidden", "loc": ("query", k), "msg": "unknown field", "input": None}
            for k in unknown
        ])
