"""Typed dependencies: the session and the supervisor come from ``app.state``, set by ``create_app``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.orm import Session, sessionmaker

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


SessionDep = Annotated[Session, Depends(get_session)]
SessionFactoryDep = Annotated[sessionmaker[Session], Depends(get_session_factory)]
SupervisorDep = Annotated[Supervisor, Depends(get_supervisor)]
