"""Who is calling: one ASGI middleware resolves every request's caller by its path, so sign-in
is default-on; what each caller may do is ``service.api.authz`` (a table, role × route).

Contract (docs/security.md):

* **Public** (never a token): ``/healthz``, the dashboard shell ``/`` and ``/static/...``, and
  the API reference page ``/docs`` (it holds no data; it reads ``/openapi.json`` with the token).
* **Worker route** (``POST /jobs/{id}/records``): only that job's
  own token, while the job is starting or running and for ``worker_token_grace_s`` after it
  ended (the route then answers 409, so a rank's late batch learns that nothing is stored after
  the end; see ``service.domain.records.scope``). No token is 401; any other token is 403, API
  tokens included: metrics come only from the job's ranks.
* **Everything else**, including routes and mounts added later: a ``Principal``, from
  ``Authorization: Bearer <token>`` where the token is one of ``TORCHYARD_API_TOKENS`` (the
  bootstrap: acts as admin, user ``admin``), a personal token (``ty_…``: its user, role and
  team; refused once revoked or expired, or when the user is disabled) or an identity
  provider's JWT (``service.domain.identity.idtokens``: the user it names). No token, an
  unknown one or a refused one is 401 with ``WWW-Authenticate: Bearer`` (``error="invalid_token"``
  when one was sent); a job token is 403. A server with no API tokens, no JWT settings and no
  personal token ever made is **open**: every caller acts as admin (``serve`` binds loopback
  only unless ``--insecure``). The first personal token closes it (within ``GATE_RECHECK_S`` for
  the other processes of ``serve --workers``), for good: recover with a bootstrap token.

Tokens are compared as SHA-256 digests (bootstrap ones with ``hmac.compare_digest``, personal
ones by an indexed lookup of the digest); only digests are kept. A personal token's
``last_used_at`` is written at most once a minute, off the request. The caller is put in
``request.state.principal`` (``PrincipalDep``).

A job token that passed is remembered for ``JOB_TOKEN_TTL_S`` (``JobTokens``), so a rank's next
batches pass without a read of the job and a hop to the thread pool (a tenth of the server's
CPU per batch, docs/benchmarks.md §7). That memory only spares the early read: the records
route checks the token again against the job row it reads in its write transaction
(``job_token_refusal``), so a token is refused there the moment its job is over (past the
grace) or its launch got a new token, whatever was remembered.
"""

import hmac
import re
import time
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Annotated, Protocol

from fastapi import Depends, Path, Request
from fastapi.responses import JSONResponse
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Receive, Scope, Send

from service.api.errors import ApiError, error_body
from service.api.middleware.signin import (
    BOOTSTRAP,
    NOBODY,
    OPEN,
    Principal,
    Refusal,
    SignIn,
    TokenSet,
    Via,
)
from service.settings.tokens import hash_token
from service.store import repository as repo
from torchyard_contract.state import ACTIVE_STATES, JobState

PUBLIC_PATHS = frozenset({"/healthz", "/", "/docs"})
PUBLIC_PREFIXES = ("/static/",)
WORKER_METHOD = "POST"
WORKER_PATH = re.compile(r"^/jobs/(?P<job_id>[0-9]{1,30})/records$")
JOB_ID_MAX = 2**63 - 1
# How long a job token that passed is taken again without reading its job, and how many are
# remembered per process (the oldest is forgotten first).
JOB_TOKEN_TTL_S = 10.0
JOB_TOKENS_MAX = 4096
# ``scope["state"]`` key of the digest of a worker route's token, for the route's own check.
JOB_TOKEN_DIGEST = "job_token_digest"
REALM = 'Bearer realm="torchyard"'
INVALID = f'{REALM}, error="invalid_token"'

__all__ = ["Principal", "PrincipalDep", "TokenSet", "Via", "AuthMiddleware", "get_principal"]


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


class JobFacts(Protocol):
    """The job columns a job token is checked against (the ORM ``Job`` or a plain row)."""

    @property
    def state(self) -> str: ...
    @property
    def token_hash(self) -> str | None: ...
    @property
    def ended_at(self) -> datetime | None: ...


def job_token_refusal(
    job_id: int, job: JobFacts | None, digest: str, now: datetime, grace: timedelta
) -> str | None:
    """Why the token whose SHA-256 is ``digest`` may not post for ``job_id`` now, given the
    job as read (None: no such job); None when it may: the job's own token, while the job is
    active and for ``grace`` after it ended."""
    generic = f"a valid job token for job {job_id} is required"
    if job is None or not job.token_hash or not hmac.compare_digest(digest, job.token_hash):
        return generic
    if JobState(job.state) in ACTIVE_STATES:
        return None
    if job.ended_at is not None and now - job.ended_at <= grace:
        return None
    return f"job {job_id} is {job.state}; its token expired"


class JobTokens:
    """Job tokens that passed lately, per process; used on the event loop only (no lock)."""

    def __init__(self, ttl_s: float = JOB_TOKEN_TTL_S, most: int = JOB_TOKENS_MAX) -> None:
        self.ttl_s, self.most = ttl_s, most
        self._passed: dict[int, tuple[str, float]] = {}  # job id → (digest, monotonic expiry)

    def passed(self, job_id: int, digest: str) -> bool:
        """``digest`` is the token that passed for ``job_id`` within the last ``ttl_s``."""
        entry = self._passed.get(job_id)
        if entry is None:
            return False
        if time.monotonic() >= entry[1]:
            del self._passed[job_id]
            return False
        return hmac.compare_digest(digest, entry[0])

    def remember(self, job_id: int, digest: str) -> None:
        self._passed.pop(job_id, None)
        while len(self._passed) >= self.most:
            del self._passed[next(iter(self._passed))]  # the oldest
        self._passed[job_id] = (digest, time.monotonic() + self.ttl_s)


class AuthMiddleware:
    """Pure ASGI (streams such as SSE pass through untouched); see the module docstring."""

    def __init__(
        self, app: ASGIApp, *, signin: SignIn, session_factory: sessionmaker[Session],
        grace_s: float,
    ) -> None:
        self.app, self.signin, self.session_factory = app, signin, session_factory
        self.grace = timedelta(seconds=grace_s)
        self.job_tokens = JobTokens()

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
            digest = hash_token(token)  # type: ignore[arg-type]  # (None: answered 401 above)
            if not self.job_tokens.passed(job_id, digest):
                refusal = await run_in_threadpool(self._worker_refusal, job_id, digest)
                if refusal:
                    await _deny(scope, send, 403, "forbidden", refusal)
                    return
                self.job_tokens.remember(job_id, digest)
            scope.setdefault("state", {})[JOB_TOKEN_DIGEST] = digest
            principal: Principal | Refusal = Principal(Via.job, job_id=job_id)
        elif not await self._closed():
            principal = OPEN
        elif token is None:
            await _deny(scope, send, 401, "unauthorized",
                        "this route needs 'Authorization: Bearer <API token>'", REALM)
            return
        elif self.signin.tokens.is_api_token(token):
            principal = BOOTSTRAP
        else:
            principal = await run_in_threadpool(self.signin.resolve, token)
        if isinstance(principal, Refusal):
            if principal.status == 403:
                await _deny(scope, send, 403, "forbidden", principal.message)
            else:
                await _deny(scope, send, 401, "unauthorized", principal.message, INVALID)
            return
        scope.setdefault("state", {})["principal"] = principal
        await self.app(scope, receive, send)

    async def _closed(self) -> bool:
        known = self.signin.closed_known()
        return known if known is not None else await run_in_threadpool(self.signin.check_closed)

    def _worker_refusal(self, job_id: int, digest: str) -> str | None:
        """Why the token of ``digest`` may not post for ``job_id`` now; None when it may."""
        if job_id > JOB_ID_MAX:
            return f"a valid job token for job {job_id} is required"
        with self.session_factory() as session:
            job = repo.get_job(session, job_id)
            return job_token_refusal(job_id, job, digest, repo.utcnow(), self.grace)


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
    """The caller the middleware resolved; on a public path, nobody (no caller: refused
    everything but public routes)."""
    return request.scope.get("state", {}).get("principal", NOBODY)


async def _principal(request: Request) -> Principal:
    # ``async``: a plain function as a dependency would cost every request a hop to the
    # thread pool.
    return get_principal(request)


PrincipalDep = Annotated[Principal, Depends(_principal)]


async def require_worker(
    job_id: Annotated[int, Path(ge=1, le=JOB_ID_MAX, description="the job's id")],
    principal: PrincipalDep,
) -> int:
    """Defence in depth for worker routes: the middleware let only this job's token through.
    (``async``: it only looks at the request, so it costs no hop to the thread pool.)"""
    if principal.via is not Via.job or principal.job_id != job_id:
        raise ApiError(403, "forbidden", f"a valid job token for job {job_id} is required")
    return job_id


def job_token_digest(request: Request) -> str:
    """The SHA-256 of the worker route's token, as the middleware computed it."""
    return request.scope.get("state", {}).get(JOB_TOKEN_DIGEST, "")


WorkerJobDep = Annotated[int, Depends(require_worker)]
