"""The HTTP application: routes, middleware and the published document over parts the
composition root (``service.app``) built. Declares; starts nothing.

Request path, outermost first: the request timer → HEAD routed as GET
(``service.api.middleware.head``) → CORS (only when ``TORCHYARD_CORS_ORIGINS`` is set) → browser
guard (``service.api.middleware.browserguard``: foreign Host without tokens, foreign Origin on
writes) → the audit log's writer (``service.api.middleware.audit``: it sees every answer) →
auth (``service.api.middleware.auth``: who is calling, default-on for every path but the public
allowlist) → body-size limit (413) → JSON bodies only (415) → routing, where every route first
checks the caller's role against ``service.api.authz`` (403) and refuses undeclared query
parameters (422).
"""

import threading
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path

from fastapi import Depends, FastAPI
from fastapi.middleware.cors import CORSMiddleware
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from service import __version__
from service.api import errors
from service.api.authz import authorize, template_for
from service.api.deps import reject_unknown_query
from service.api.hotreads import HotReads
from service.api.middleware.audit import AuditMiddleware
from service.api.middleware.auth import AuthMiddleware
from service.api.middleware.bodylimit import BodyLimitMiddleware
from service.api.middleware.browserguard import BrowserGuardMiddleware, JsonBodyMiddleware
from service.api.middleware.head import HeadAsGetMiddleware
from service.api.middleware.signin import SignIn
from service.api.middleware.writegate import RECORD_SLOTS, WriteGate
from service.api.openapi import ServedDocument
from service.api.routes import (
    apidocs,
    artifacts,
    dashboard,
    deliveries,
    events,
    jobs,
    logs,
    packages,
    records,
    resources,
    series,
    stacks,
    summary,
    sweeps,
)
from service.api.routes.accounts import audit, teams, usage, users
from service.api.routes.prometheus import RequestTimer, Telemetry
from service.api.routes.prometheus import router as prometheus_router
from service.api.stacksgate import StacksGate
from service.domain.files.diskspace import free_bytes
from service.domain.identity.accounts import Accounts
from service.domain.loop.supervisor import Supervisor
from service.domain.queue.fairshare import HOUR_S
from service.domain.queue.standing import Standings
from service.executor.base import Executor, WarmReporter
from service.settings import Settings
from service.store.changefeed import ChangeFeed


@dataclass(frozen=True)
class Parts:
    """What the routes use, built by the composition root (``service.app.create_app``)."""

    settings: Settings
    session_factory: sessionmaker[Session]
    read_session_factory: sessionmaker[Session]
    read_engine: Engine  # hot reads take a plain connection (service.api.deps)
    changes: ChangeFeed
    supervisor: Supervisor
    executor: Executor
    warm: WarmReporter | None  # the warm-rank pool; None when warm ranks are off
    signin: SignIn  # who a token names (bootstrap tokens, personal tokens, JWTs)
    prometheus_multiprocess_dir: Path | None = None


def build_api(
    parts: Parts, lifespan: Callable[[FastAPI], AbstractAsyncContextManager[None]]
) -> FastAPI:
    """The app over ``parts``; ``lifespan`` starts and stops what the composition root owns
    (``app.state.draining`` is set when it stops, so streams end)."""
    app = FastAPI(
        title="torchyard", version=__version__, lifespan=lifespan,
        dependencies=[Depends(authorize), Depends(reject_unknown_query)],
        responses=errors.ERROR_RESPONSES,
        # /docs is served by service.api.routes.apidocs from assets the wheel ships (no CDN).
        docs_url=None, redoc_url=None,
        # operationId = the route function's name (submit_job, read_metrics...): what generated
        # clients call their methods. Names are unique (test_openapi checks the clients).
        generate_unique_id_function=lambda route: route.name,
    )
    settings, supervisor, signin = parts.settings, parts.supervisor, parts.signin
    tokens = signin.tokens
    app.state.settings = settings
    app.state.session_factory = parts.session_factory
    app.state.changes = parts.changes
    app.state.hot_reads = HotReads()  # metrics polls and event streams (bounded, shared)
    app.state.stacks_gate = StacksGate(settings.stacks_per_job, settings.stacks_in_flight)
    app.state.write_gate = WriteGate(settings.db_lock_timeout_s)  # writes on the thread pool (bounded)
    app.state.record_gate = WriteGate(settings.db_lock_timeout_s, RECORD_SLOTS)  # record posts'
    app.state.read_session_factory = parts.read_session_factory
    app.state.read_engine = parts.read_engine  # hot reads take a plain connection (service.api.deps)
    app.state.supervisor = supervisor
    app.state.draining = threading.Event()  # set on shutdown: streams end (service.api.drain)
    app.state.executor = parts.executor
    app.state.warm = parts.warm
    app.state.signin = signin
    app.state.accounts = Accounts(parts.session_factory, signin.close)
    # Teams' usage and fair-share standing for GET /teams (this process's own ledger).
    app.state.standings = Standings(settings.usage_half_life_h * HOUR_S)
    errors.install(app)
    app.state.telemetry = Telemetry(
        parts.read_session_factory, supervisor.inventory, parts.warm,
        parts.prometheus_multiprocess_dir,
        home=settings.home,
    )
    app.include_router(jobs.router)
    app.include_router(records.router)
    app.include_router(resources.router)
    app.include_router(series.router)
    app.include_router(dashboard.router)
    app.include_router(apidocs.router)
    app.include_router(summary.router)
    app.include_router(logs.router)
    app.include_router(events.router)
    app.include_router(deliveries.router)
    app.include_router(stacks.router)
    app.include_router(sweeps.router)
    app.include_router(packages.router)
    app.include_router(artifacts.router)
    app.include_router(teams.router)
    app.include_router(usage.router)
    app.include_router(users.router)
    app.include_router(audit.router)
    app.include_router(prometheus_router)

    @app.get("/healthz", tags=["meta"])
    async def healthz() -> dict[str, str | int | bool]:
        """``role``: ``supervisor`` in the process that holds the supervisor lease, ``standby``
        in the others (docs/operations.md). ``disk_free_bytes``: free space under
        ``TORCHYARD_HOME``; ``disk_low``: below ``TORCHYARD_DISK_FREE_FLOOR_BYTES`` (new jobs
        and uploads are refused with 507, running jobs carry on)."""
        # On the event loop: answered even when every thread of the pool waits on the database.
        free = free_bytes(settings.home)
        return {"status": "ok", "role": "supervisor" if supervisor.acting else "standby",
                "disk_free_bytes": free,
                "disk_low": free < settings.disk_free_floor_bytes}

    # add_middleware wraps: the last one added runs first.
    streamed = frozenset({("POST", packages.UPLOAD_PATH)})  # an archive, streamed to disk
    app.add_middleware(JsonBodyMiddleware, binary=streamed)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes, streamed=streamed)
    app.add_middleware(
        # Token checks only read: they never wait for (or hold up) a metric write.
        AuthMiddleware, signin=signin, session_factory=parts.read_session_factory,
        grace_s=settings.worker_token_grace_s,
    )
    app.add_middleware(AuditMiddleware, sessions=parts.session_factory, template_for=template_for)
    app.add_middleware(
        BrowserGuardMiddleware, check_host=not tokens.enabled,
        host_names=settings.server_host_names(), origins=settings.cors_origins,
    )
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware, allow_origins=settings.cors_origins, allow_credentials=False,
            allow_methods=["GET", "POST", "PATCH", "DELETE"],
            allow_headers=["Authorization", "Content-Type", "Idempotency-Key", "Last-Event-ID"],
        )
    # HEAD on every GET route, checked as the GET it becomes (service.api.middleware.head).
    app.add_middleware(HeadAsGetMiddleware)
    # Outermost: the latency histogram sees every answer, auth's 401s and the 413s included.
    app.add_middleware(RequestTimer, telemetry=app.state.telemetry)
    # This server's bounds: the local executor's (single host) and its webhook endpoints.
    app.openapi = ServedDocument(  # type: ignore[method-assign]
        app, api_tokens=settings.api_tokens_configured, single_host=not parts.executor.spans_nodes,
        webhooks_file=settings.webhooks_file, body_models=records.BODY_MODELS,
    )
    return app
