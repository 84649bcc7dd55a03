"""Who may call what: one ASGI middleware gates every request by its path, so auth is default-on.

Contract (docs/security.md):

* **Public** (never a token): ``/healthz``, the dashboard shell ``/`` and ``/static/...``, and
  the API reference page ``/docs`` (it holds no data; it reads ``/openapi.json`` with the token).
* **Worker route** (``POST /jobs/{id}/records``): only that job's
  own token, while the job is starting or running and for ``worker_token_grace_s`` after it
  ended (the route then answers 409, so a rank's late batch learns that nothing is stored after
  the end; see ``service.domain.records.scope``). No token is 401; any other token is 403, API tokens included: metrics come only
  from the job's ranks.
* **Everything else**, including routes and mounts added later (``/metrics``, ``/events``...):
  with API tokens configured, ``Authorization: Bearer <API token>``. No token or an unknown one is
  401 with ``WWW-Authenticate: Bearer``; a job token is 403. Without API tokens the API is open to
  whoever can reach it (``serve`` binds loopback only unless ``--insecure``).

Tokens are compared as SHA-256 digests with ``hmac.compare_digest``; only digests are kept. The
caller is put in ``request.state.principal`` (``PrincipalDep``).
"""

import hmac
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta
from enum import Enum
from typing import Annotated

from fastapi import Depends, Path, Request
from fastapi.responses import JSONResponse
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Receive, Scope, Send

from service.api.errors import ApiError, error_body
from service.settings.tokens import hash_token
from service.store import repository as repo
from torchyard_contract.state import ACTIVE_STATES, JobState

PUBLIC_PATHS = frozenset({"/healthz", "/", "/docs"})
PUBLIC_PREFIXES = ("/static/",)
WORKER_METHOD = "POST"
WORKER_PATH = re.compile(r"^/jobs/(?P<job_id>[0-9]{1,30})/records$")
JOB_ID_MAX = 2**63 - 1
REALM = 'Bearer realm="torchyard"'


class Role(str, Enum):
    anonymous = "anonymous"  # no API tokens are configured: the API is open
    api = "api"
    job = "job"


@dataclass(frozen=True)
class Principal:
    role: Role
    job_id: int | None = None


ANONYMOUS = Principal(Role.anonymous)


@dataclass(frozen=True)
class TokenSet:
    """SHA-256 digests of the API tokens; empty means tokens are off."""

    digests: frozenset[str]

    @property
    def enabled(self) -> bool:
        return bool(self.digests)

    def is_api_token(self, token: str) -> bool:
        digest = hash_token(token)
        found = False
        for known in self.digests:  # no early exit: time does not depend on which one matched
            found |= hmac.compare_digest(digest, known)
        return found


def is_public(path: str) -> bool:
    return path in PUBLIC_PATHS or path.startswith(PUBLIC_PREFIXES)


def worker_job_id(method: str, path: str) -> int | None:
    """The job id when ``method path`` is a worker route, else None."""
    match = WORKER_PATH.match(path)
    return int(match["job_id"]) if method == WORKER_METHOD and match else None


def bearer_token(headers: Iterable[tuple[bytes, bytes]]) -> str | None:
    """The token of an ``Authorization: Bearer`` header; None if absent or another scheme."""
    for key, value in headers:
        if key.lower() == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            token = token.strip()
            return token if scheme.lower() == "bearer" and token else None
    return None


class AuthMiddleware:
    """Pure ASGI (streams such as SSE pass through untouched); see the module docstring."""

    def __init__(
        self, app: ASGIApp, *, tokens: TokenSet, session_factory: sessionmaker[Session],
        grace_s: float,
    ) -> None:
        self.app, self.tokens, self.session_factory = app, tokens, session_factory
        self.grace = timedelta(seconds=grace_s)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or is_public(scope["path"]):
            await self.app(scope, receive, send)
            return
        token = bearer_token(scope.get("headers", []))
        job_id = worker_job_id(scope.get("method", "GET"), scope["path"])
        if job_id is not None and token is None:
            await _deny(scope, send, 401, "unauthorized",
                        f"this route needs 'Authorization: Bearer <job {job_id} token>'", REALM)
            return
        if job_id is not None:
            refusal = await run_in_threadpool(self._worker_refusal, job_id, token)
            if refusal:
                await _deny(scope, send, 403, "forbidden", refusal)
                return
            principal = Principal(Role.job, job_id)
        elif not self.tokens.enabled:
            principal = ANONYMOUS
        elif token is None:
            await _deny(scope, send, 401, "unauthorized",
                        "this route needs 'Authorization: Bearer <API token>'", REALM)
            return
        elif self.tokens.is_api_token(token):
            principal = Principal(Role.api)
        elif await run_in_threadpool(self._is_job_token, token):
            await _deny(scope, send, 403, "forbidden",
                        "a job token may only post records for its own job")
            return
        else:
            await _deny(scope, send, 401, "unauthorized", "invalid API token",
                        f'{REALM}, error="invalid_token"')
            return
        scope.setdefault("state", {})["principal"] = principal
        await self.app(scope, receive, send)

    def _worker_refusal(self, job_id: int, token: str | None) -> str | None:
        """Why ``token`` may not post for ``job_id`` now; None when it may."""
        generic = f"a valid job token for job {job_id} is required"
        if token is None or job_id > JOB_ID_MAX:  # (no token: answered 401 before this)
            return generic
        with self.session_factory() as session:
            job = repo.get_job(session, job_id)
            if job is None or not job.token_hash:
                return generic
            if not hmac.compare_digest(hash_token(token), job.token_hash):
                return generic
            if JobState(job.state) in ACTIVE_STATES:
                return None
            if job.ended_at is not None and repo.utcnow() - job.ended_at <= self.grace:
                return None
            return f"job {job_id} is {job.state}; its token expired"

    def _is_job_token(self, token: str) -> bool:
        with self.session_factory() as session:
            return repo.job_id_for_token_hash(session, hash_token(token)) is not None


async def _deny(
    scope: Scope, send: Send, status: int, error: str, message: str, challenge: str | None = None
) -> None:
    if scope["type"] == "websocket":
        await send({"type": "websocket.close", "code": 1008, "reason": message})
        return
    headers = {"WWW-Authenticate": challenge} if challenge else None
    response = JSONResponse(error_body(error, message), status_code=status, headers=headers)
    await response(scope, _no_receive, send)


async def _no_receive() -> dict:  # a JSONResponse never reads the request
    return {"type": "http.disconnect"}


def get_principal(request: Request) -> Principal:
    return request.scope.get("state", {}).get("principal", ANONYMOUS)


PrincipalDep = Annotated[Principal, Depends(get_principal)]


def require_worker(
    job_id: Annotated[int, Path(ge=1, le=JOB_ID_MAX, description="the job's id")],
    principal: PrincipalDep,
) -> int:
    """Defence in depth for worker routes: the middleware let only this job's token through."""
    if principal.role is not Role.job or principal.job_id != job_id:
        raise ApiError(403, "forbidden", f"a valid job token for job {job_id} is required")
    return job_id


WorkerJobDep = Annotated[int, Depends(require_worker)]
