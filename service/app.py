"""The composition root: ``create_app(settings)`` builds the store's engines, the executor, the
warm-rank pool and the supervisor, and hands them to the HTTP application
(``service.api.application.build_api``). The one place that knows every concrete part; nothing
imports it but the command line (``service.cli``, ``service.serve``), the OpenAPI export
(``tools/openapi.py``), the benchmarks and the tests. No module-level state.
"""

import gc
import logging
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI

from service.api.application import Parts, build_api
from service.api.middleware.signin import SignIn, TokenSet
from service.api.routes.prometheus import PROMETHEUS_DIR_VARIABLE
from service.domain.identity.accounts import check_configured_unix_users
from service.domain.identity.idtokens import JwtVerifier
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
    ``prometheus_multiprocess_dir``: this app is one of several API processes whose
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
        api_url=api_url or settings.api_url_for_ranks(),
    )
    if run_supervisor:
        # Refuse to start rather than accept jobs that could not run (ValueError, named).
        try:
            executor.preflight(settings.runs_dir, supervisor.api_url)
        except ExecutorError as exc:
            raise ValueError(f"executor {executor.name}: cannot ask Slurm: {exc}") from exc

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        settings.runs_dir.mkdir(parents=True, exist_ok=True)
        upgrade(settings.resolved_database_url)
        check_configured_unix_users(session_factory)  # refuse to start, naming the team
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
        # (docs/benchmarks.md, "Stores and API processes"). Frozen without a collection first: the
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

    parts = Parts(
        settings=settings, session_factory=session_factory,
        read_session_factory=read_session_factory, read_engine=read_engine, changes=changes,
        supervisor=supervisor, executor=executor, warm=warm,
        signin=SignIn(tokens, read_session_factory, session_factory,
                      JwtVerifier.from_settings(settings)),
        prometheus_multiprocess_dir=prometheus_multiprocess_dir,
    )
    return build_api(parts, lifespan)




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
    """The app of one ``torchyard serve --workers N`` API process, from ``TORCHYARD_*`` and
    the parent's ``PROMETHEUS_MULTIPROC_DIR`` (``service.serve``)."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)  # as ``torchyard serve`` (service.cli)
    shared = os.environ.get(PROMETHEUS_DIR_VARIABLE)
    return create_app(Settings(), prometheus_multiprocess_dir=Path(shared) if shared else None,
                      freeze_heap=True)
