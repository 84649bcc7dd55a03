"""``create_app(settings)``: wires storage, supervisor and routes. No module-level state."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from service import __version__
from service.api import errors, jobs, records, resources
from service.db import make_engine, make_session_factory, upgrade
from service.launcher import Launcher, LocalTorchrunLauncher
from service.resources import make_inventory
from service.settings import Settings
from service.supervisor import Supervisor


def create_app(
    settings: Settings, *, api_url: str | None = None, launcher: Launcher | None = None,
    run_supervisor: bool = True,
) -> FastAPI:
    """The app. Migrations run and the supervisor starts (after recovery) when it starts up."""
    engine = make_engine(settings.resolved_database_url)
    session_factory = make_session_factory(engine)
    read_engine = make_engine(settings.resolved_database_url, readonly=True)
    supervisor = Supervisor(
        settings=settings,
        session_factory=session_factory,
        inventory=make_inventory(settings.gpus, settings.cpu_slots),
        launcher=launcher or LocalTorchrunLauncher(),
        api_url=api_url or settings.api_url_for_workers(),
    )

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        settings.runs_dir.mkdir(parents=True, exist_ok=True)
        upgrade(settings.resolved_database_url)
        if run_supervisor:
            supervisor.start()
        try:
            yield
        finally:
            supervisor.stop()
            engine.dispose()
            read_engine.dispose()

    app = FastAPI(title="torchyard", version=__version__, lifespan=lifespan)
    app.state.settings = settings
    app.state.session_factory = session_factory
    app.state.read_session_factory = make_session_factory(read_engine)
    app.state.supervisor = supervisor
    errors.install(app)
    app.include_router(jobs.router)
    app.include_router(records.router)
    app.include_router(resources.router)

    @app.get("/healthz", tags=["meta"])
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app
