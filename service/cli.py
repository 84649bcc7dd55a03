"""The ``torchyard`` command: ``serve``, ``db upgrade``, and the client commands (``service.client``)."""

from __future__ import annotations

import logging

import typer

from service.client.commands import register as register_client_commands
from service.settings import Settings

app = typer.Typer(help="torchyard: run PyTorch DDP jobs over REST and keep what every rank reports.")
db_app = typer.Typer(help="Database schema (Alembic).")
app.add_typer(db_app, name="db")
register_client_commands(app)


@app.command()
def serve(
    host: str = typer.Option(None, help="bind address (default 127.0.0.1 or $TORCHYARD_HOST)"),
    port: int = typer.Option(None, help="port (default 8000 or $TORCHYARD_PORT)"),
) -> None:
    """Run the API and the supervisor (migrates the database first)."""
    import uvicorn

    from service.api.app import create_app

    overrides = {k: v for k, v in {"host": host, "port": port}.items() if v is not None}
    settings = Settings(**overrides)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_level="info")


@db_app.command("upgrade")
def db_upgrade(revision: str = typer.Argument("head")) -> None:
    """Create or upgrade the schema to ``revision``."""
    from service.db import upgrade

    settings = Settings()
    upgrade(settings.resolved_database_url, revision)
    typer.echo(f"database at {settings.resolved_database_url} is at {revision}")


def main() -> None:
    app()
