"""The audit log's writer: one ASGI middleware around sign-in, so it sees every answer.

Appended (``service.store.audit``): every state-changing request (POST, PUT, PATCH, DELETE,
whatever its outcome), every request refused for authentication or authorization (401, 403,
and the 404 of another team's job, sweep or package), with the time, the actor (the user;
null when nobody signed in), how they signed in, the token's id (never the token), the method
and route template, the target (the path's id, or the one a ``Location`` header names), the
status and the client's address. Not appended: record posts by a job's own token (the job's
own data, thousands a minute), and reads that succeed.

The row is written before the answer's first byte leaves, so a client that reads ``GET
/audit`` after its answer finds it. A database that cannot take it (busy) loses that row and
logs it; it never fails the request.
"""

import logging
import re
from collections.abc import Callable

from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.middleware.auth import worker_job_id
from service.api.middleware.signin import Principal
from service.store import audit

logger = logging.getLogger(__name__)

STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
REFUSED = frozenset({401, 403})
# The path parameter that names a request's target, and the word for it.
TARGETS = (("job_id", "job"), ("sweep_id", "sweep"), ("token_id", "token"), ("digest", "package"))
_SINGULAR = {"jobs": "job", "sweeps": "sweep", "tokens": "token", "teams": "team",
             "users": "user", "packages": "package"}
_LOCATION = re.compile(r"/(jobs|sweeps|tokens|teams|users|packages)/([^/?]+)$")


class AuditMiddleware:
    """``template_for(method, path)``: the route template of a request refused before it was
    routed (``service.api.authz.template_for``)."""

    def __init__(
        self, app: ASGIApp, *, sessions: sessionmaker[Session],
        template_for: Callable[[str, str], str | None],
    ) -> None:
        self.app, self.sessions, self.template_for = app, sessions, template_for

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        method = scope.get("method", "GET")
        worker = worker_job_id(method, scope["path"]) is not None
        if method in STATE_CHANGING and not worker:
            await self._held_until_recorded(scope, receive, send)
            return

        async def audited_send(message: Message) -> None:
            if message["type"] == "http.response.start" and _refused(scope, message["status"]):
                await run_in_threadpool(self._append, scope, message["status"], message)
            await send(message)

        await self.app(scope, receive, audited_send)

    async def _held_until_recorded(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A state-changing request: its answer (small JSON) is held until the route is done
        and its session closed (on SQLite it holds the write lock until then), the row is
        written, then the answer goes out."""
        held: list[Message] = []

        async def hold(message: Message) -> None:
            held.append(message)

        try:
            await self.app(scope, receive, hold)
        finally:
            start = next((m for m in held if m["type"] == "http.response.start"), None)
            if start is not None:
                await run_in_threadpool(self._append, scope, start["status"], start)
            for message in held:
                await send(message)

    def _append(self, scope: Scope, status: int, start: Message) -> None:
        principal: Principal | None = scope.get("state", {}).get("principal")
        route = scope.get("route")
        template = getattr(route, "path", None) or self.template_for(scope["method"],
                                                                      scope["path"])
        client = scope.get("client")
        row = audit.AuditRow(
            actor=principal.user if principal else None,
            via=principal.via.value if principal else None,
            token_id=principal.token_id if principal else None,
            method=scope["method"], route=template or scope["path"][:200],
            target=_target(scope, start), status=status,
            client=client[0] if client else None,
        )
        try:
            with self.sessions() as session:
                audit.append(session, row)
                session.commit()
        except Exception as exc:  # the request's outcome stands; the row is lost, said so
            logger.error("audit: not recorded (%s %s %s by %s): %s", row.method, row.route,
                         row.status, row.actor, exc)


def _refused(scope: Scope, status: int) -> bool:
    """Refused for authentication or authorization (another team's target included)."""
    return status in REFUSED or (status == 404 and bool(scope.get("state", {}).get("hidden")))


def _target(scope: Scope, start: Message) -> str | None:
    """What the request acted on: what it made (``Location``), or the path's id."""
    for key, value in start.get("headers", []):
        if key.lower() == b"location":
            found = _LOCATION.search(value.decode("latin-1"))
            if found:
                return f"{_SINGULAR[found[1]]} {found[2]}"
    params = scope.get("path_params") or {}
    for name, word in TARGETS:
        if name in params:
            return f"{word} {params[name]}"
    if "name" in params:  # /teams/{name}, /users/{name}[/tokens]
        kind = "team" if scope["path"].startswith("/teams/") else "user"
        return f"{kind} {params['name']}"
    return None
