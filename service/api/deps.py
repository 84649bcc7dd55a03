"""Typed dependencies: the session and the supervisor come from ``app.state``, set by ``create_app``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.orm import Session, sessionmaker

from service.supervisor import Supervisor

READ_METHODS = frozenset({"GET", "HEAD"})


def get_session(request: Request) -> Iterator[Session]:
    """A writer session; for GET/HEAD a read-only one (GET routes never write).

    Reads on the read-only engine never queue behind metric writes (see ``service.db``).
    """
    state = request.app.state
    factory = state.session_factory
    if request.method in READ_METHODS:
        factory = getattr(state, "read_session_factory", factory)
    with factory() as session:
        yield session


def get_session_factory(request: Request) -> sessionmaker[Session]:
    """For routes that must not hold one session for their whole life (long polls, streams)."""
    return request.app.state.session_factory


def get_supervisor(request: Request) -> Supervisor:
    return request.app.state.supervisor


SessionDep = Annotated[Session, Depends(get_session)]
SessionFactoryDep = Annotated[sessionmaker[Session], Depends(get_session_factory)]
SupervisorDep = Annotated[Supervisor, Depends(get_supervisor)]
