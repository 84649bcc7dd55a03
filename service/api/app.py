"""``create_app(settings)``: wires storage, supervisor, routes and the security layers.

Request path, outermost first: HEAD routed as GET (``service.api.middleware.head``) → CORS (only when
``TORCHYARD_CORS_ORIGINS`` is set) → browser
guard (``service.api.middleware.browserguard``: foreign Host without tokens, foreign Origin on writes) →
auth (``service.api.middleware.auth``: default-on for every path but the public allowlist) → body-size
limit (413) → JSON bodies only (415) → routing, where every route also refuses undeclared query parameters (422).
No module-level state.
"""

import gc
import logging
import os
import sys
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import Depends, FastAPI
from fastapi.middleware.cors import CORSMiddleware

from service import __version__
from service.api import errors
from service.api.deps import reject_unknown_query
from service.api.hotreads import HotReads
from service.api.middleware.auth import AuthMiddleware, TokenSet
from service.api.middleware.bodylimit import BodyLimitMiddleware
from service.api.middleware.browserguard import BrowserGuardMiddleware, JsonBodyMiddleware
from service.api.middleware.head import HeadAsGetMiddleware
from service.api.middleware.writegate import WriteGate
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
from service.api.routes.prometheus import PROMETHEUS_DIR_VARIABLE, RequestTimer, Telemetry
from service.api.routes.prometheus import router as prometheus_router
from service.domain.files.diskspace import free_bytes
from service.domain.loop.supervisor import LOOP_LOCK_TIMEOUT_S, Supervisor
from service.domain.queue.inventory import make_inventory
from service.executor import Executor, make_executor
from service.executor.base import ExecutorError
from service.executor.gpus import detect_gpus
from service.executor.warmpool import WarmPool
from service.settings import Settings
from service.store.changefeed import ChangeFeed, PgListener
from service.store.db import make_engine, make_session_factory, upgrade, with_lock_timeout


def create_app(
    settings: Settings, *, api_url: str | None = None, executor: Executor | None = None,
    run_supervisor: bool = True, prometheus_multiprocess_dir: Path | None = None,
    freeze_heap: bool = False,
) -> FastAPI:
    """The app. Migrations run and the supervisor starts (after recovery) when it starts up.
    ``prometheus_multiprocess_dir``: this app is one of several worker processes whose
    Prometheus counters are summed there (``service.api.routes.prometheus.Telemetry``).
    ``freeze_heap``: the process serves this one app for its lifetime (``torchyard serve``):
    at start-up, freeze the heap and turn the cyclic collector on (its caller turned it off
    while it imported and built the app; see the lifespan). Off where one process builds many
    apps (the tests, the OpenAPI export): there each start-up would freeze every earlier app's
    objects for good.

    Raises ``ValueError`` when a configured tokens file is unreadable or empty (fail closed).
    """
    tokens = TokenSet(settings.api_token_digests())
    warm = None
    if executor is None:
        warm = _warm_pool(settings)
        executor = make_executor(settings, warm=warm)
    lock_timeout_s = settings.db_lock_timeout_s  # a request's lock wait; then 503
    engine = make_engine(settings.resolved_database_url, lock_timeout_s=lock_timeout_s)
    changes = ChangeFeed()
    session_factory = make_session_factory(engine, changes)
    read_engine = make_engine(
        settings.resolved_database_url, readonly=True, lock_timeout_s=lock_timeout_s
    )
    read_session_factory = make_session_factory(read_engine)
    supervisor = Supervisor(
        settings=settings,
        session_factory=session_factory,
        # The loop's own writes wait less, and retry on its next pass (docs/operations.md).
        loop_session_factory=make_session_factory(
            with_lock_timeout(engine, min(lock_timeout_s, LOOP_LOCK_TIMEOUT_S)), changes
        ),
        read_session_factory=read_session_factory,
        inventory=make_inventory(settings.gpus, settings.cpu_slots, detect_gpus),
        executor=executor,
        api_url=api_url or settings.api_url_for_workers(),
    )
    if run_supervisor:
        # Refuse to start rather than accept jobs that could not run (ValueError, named).
        try:
            executor.preflight(settings.runs_dir, supervisor.api_url)
        except ExecutorError as exc:
            raise ValueError(f"executor {executor.name}: cannot ask Slurm: {exc}") from exc

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        settings.runs_dir.mkdir(parents=True, exist_ok=True)
        upgrade(settings.resolved_database_url)
        # PostgreSQL: hear every process's commits (SQLite: only this process's, see changefeed).
        listener = None
        if engine.dialect.name == "postgresql":
            listener = PgListener(settings.resolved_database_url, changes)
            listener.start()
        if run_supervisor:
            if warm is not None:
                warm.start()  # in the background: jobs start cold until it is ready
            supervisor.start()
        # Everything built so far (the app, its routes and schemas, SQLAlchemy's and pydantic's
        # caches: most of the heap) lives as long as the process: keep it out of the cyclic
        # collector's full passes, which otherwise stalled every request ~0.1 s now and then
        # (docs/benchmarks.md, "Stores and workers"). Frozen without a collection first: the
        # start-up leaves ~1,100 unreachable objects behind, while a full pass over its ~190,000
        # cost 0.08 CPU s of every start (measured).
        if freeze_heap:
            gc.freeze()
            gc.enable()  # ``torchyard serve`` started with it off (service.cli)
        try:
            yield
        finally:
            if freeze_heap:
                gc.unfreeze()  # an app that stops leaves its objects collectable
            app.state.draining.set()
            supervisor.stop()
            if warm is not None:
                warm.close()
            if listener is not None:
                listener.stop()
            engine.dispose()
            read_engine.dispose()

    app = FastAPI(
        title="torchyard", version=__version__, lifespan=lifespan,
        dependencies=[Depends(reject_unknown_query)], responses=errors.ERROR_RESPONSES,
        # /docs is served by service.api.routes.apidocs from assets the wheel ships (no CDN).
        docs_url=None, redoc_url=None,
        # operationId = the route function's name (submit_job, read_metrics...): what generated
        # clients call their methods. Names are unique (test_openapi checks the clients).
        generate_unique_id_function=lambda route: route.name,
    )
    app.state.settings = settings
    app.state.session_factory = session_factory
    app.state.changes = changes
    app.state.hot_reads = HotReads()  # metrics polls and event streams (bounded, shared)
    app.state.write_gate = WriteGate(lock_timeout_s)  # writes on the thread pool (bounded)
    app.state.read_session_factory = read_session_factory
    app.state.read_engine = read_engine  # hot reads take a plain connection (service.api.deps)
    app.state.supervisor = supervisor
    app.state.draining = threading.Event()  # set on shutdown: streams end (service.api.drain)
    app.state.executor = executor
    app.state.warm = warm
    errors.install(app)
    app.state.telemetry = Telemetry(
        read_session_factory, supervisor.inventory, warm, prometheus_multiprocess_dir,
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
        AuthMiddleware, tokens=tokens, session_factory=read_session_factory,
        grace_s=settings.worker_token_grace_s,
    )
    app.add_middleware(
        BrowserGuardMiddleware, check_host=not tokens.enabled,
        host_names=settings.server_host_names(), origins=settings.cors_origins,
    )
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware, allow_origins=settings.cors_origins, allow_credentials=False,
            allow_methods=["GET", "POST", "DELETE"],
            allow_headers=["Authorization", "Content-Type", "Idempotency-Key", "Last-Event-ID"],
        )
    # HEAD on every GET route, checked as the GET it becomes (service.api.middleware.head).
    app.add_middleware(HeadAsGetMiddleware)
    # Outermost: the latency histogram sees every answer, auth's 401s and the 413s included.
    app.add_middleware(RequestTimer, telemetry=app.state.telemetry)
    # This server's bounds: the local executor's (single host) and its webhook endpoints.
    app.openapi = ServedDocument(  # type: ignore[method-assign]
        app, api_tokens=tokens.enabled, single_host=not supervisor.slurm,
        webhooks_file=settings.webhooks_file, body_models=records.BODY_MODELS,
    )
    return app


def _warm_pool(settings: Settings) -> WarmPool | None:
    """The warm-rank pool of the local executor, when ``TORCHYARD_WARM_RANKS`` is on."""
    if not settings.warm_ranks or settings.executor != "local":
        return None
    return WarmPool(
        python=settings.python_executable or sys.executable, home=settings.home,
        size=warm_pool_size(settings), preload=settings.warm_preload,
        max_memory_mib=settings.warm_max_memory_mib, directory=settings.warm_dir,
    )


def warm_pool_size(settings: Settings) -> int:
    """``TORCHYARD_WARM_POOL_SIZE``, or sized from the slots: the largest CPU job this host
    runs (a rank per CPU slot) and its torchrun agent, at most 8."""
    if settings.warm_pool_size is not None:
        return settings.warm_pool_size
    return 1 + min(settings.cpu_slots, 7)


def create_app_from_environment() -> FastAPI:
    """The app of one ``torchyard serve --workers N`` worker process, from ``TORCHYARD_*`` and
    the parent's ``PROMETHEUS_MULTIPROC_DIR`` (``service.api.processes``)."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    shared = os.environ.get(PROMETHEUS_DIR_VARIABLE)
    return create_app(Settings(), prometheus_multiprocess_dir=Path(shared) if shared else None,
                      freeze_heap=True)
