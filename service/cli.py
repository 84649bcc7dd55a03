"""The ``torchyard`` command: ``serve``, ``db upgrade``, and the client commands (``service.client``)."""

import gc
import ipaddress
import logging
import os
import socket
import sys
from typing import NoReturn

import typer
from pydantic import ValidationError

from service.settings import Settings

app = typer.Typer(help="torchyard: run PyTorch DDP jobs over REST and keep what every rank reports.")
db_app = typer.Typer(help="Database schema (Alembic).")
app.add_typer(db_app, name="db")
# The commands that run here (not the client's): ``serve`` and ``db`` start without importing
# the client (httpx, the typed client, rich tables: ~0.1 CPU s of each server start).
SERVER_COMMANDS = frozenset({"serve", "db"})


def is_loopback(host: str) -> bool:
    """True when every address ``host`` names is a loopback one (unresolvable: False)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(i[4][0]).is_loopback for i in infos)


def _fail(message: str) -> NoReturn:
    typer.echo(f"torchyard serve: {message}", err=True)
    raise typer.Exit(2)


@app.command()
def serve(
    host: str = typer.Option(None, help="bind address (default 127.0.0.1 or $TORCHYARD_HOST)"),
    port: int = typer.Option(None, help="port (default 8000 or $TORCHYARD_PORT)"),
    insecure: bool = typer.Option(
        False, "--insecure",
        help="bind a non-loopback address without API tokens: anyone who reaches the port "
        "can run jobs on this machine",
    ),
    workers: int = typer.Option(
        1, min=1, max=64,
        help="API processes sharing the port and the database; one of them (the lease "
        "holder) supervises, the others stand by (docs/operations.md)",
    ),
    fd: int = typer.Option(
        None, "--fd", min=0,
        help="serve on the listening TCP socket inherited as this file descriptor (socket "
        "activation, e.g. a systemd .socket unit passes its socket as 3); its address "
        "replaces --host and --port (docs/operations.md)",
    ),
) -> None:
    """Run the API and the supervisor (migrates the database first)."""
    # Off until the app has started: the lifespan freezes what start-up built
    # (nearly all of it lives as long as the process) and turns the collector back on. Passes
    # over that growing heap were ~11 % of a start's CPU (docs/benchmarks.md, finding 12).
    gc.disable()
    from service.api.drain import serve as serve_app
    from service.app import create_app
    from service.store.db import upgrade

    overrides = {k: v for k, v in {"host": host, "port": port}.items() if v is not None}
    sock = None
    if fd is not None:
        if overrides:
            _fail("--fd takes the address of the socket it names: leave --host and --port out")
        from service.serve import inherited_socket

        try:
            sock = inherited_socket(fd)
        except OSError as exc:
            _fail(f"--fd {fd}: {exc}")
        address = sock.getsockname()
        overrides = {"host": address[0], "port": address[1]}
    try:
        settings = Settings(**overrides)
    except ValidationError as exc:  # inputs are hidden in these errors: no token is echoed
        _fail(f"invalid settings:\n{exc}")
    if not settings.api_tokens_configured and not is_loopback(settings.host):
        if not insecure:
            _fail(
                f"refusing to bind {settings.host!r} without API tokens: anyone who can reach "
                "it could run code on this machine. Set TORCHYARD_API_TOKENS (or "
                "TORCHYARD_API_TOKENS_FILE), bind 127.0.0.1, or pass --insecure if a firewall "
                "or proxy already guards the port."
            )
        typer.echo(f"torchyard serve: WARNING: {settings.host!r} is served WITHOUT API tokens "
                   "(--insecure)", err=True)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # httpx logs every request at INFO: a line per MLflow call of every exported job, several a
    # second; the exporter and the webhook sender log their outcomes themselves.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        application = create_app(settings, freeze_heap=True)
    except ValueError as exc:  # e.g. a tokens file that is missing or empty: fail closed
        _fail(str(exc))
    if sock is not None:
        typer.echo(f"torchyard serve: listening on {settings.host}:{settings.port} (--fd {fd})",
                   err=True)
    if workers == 1:
        serve_app(application, settings.host, settings.port,
                  sockets=[sock] if sock is not None else None)
        return
    # Migrate once here, so the API processes' own upgrade at start-up finds nothing to do
    # (several migrating at once would race). Each builds its app from the environment.
    from service.serve import run_api_processes

    upgrade(settings.resolved_database_url)
    os.environ.update(TORCHYARD_HOST=settings.host, TORCHYARD_PORT=str(settings.port))
    try:
        status = run_api_processes(settings.host, settings.port, workers, inherited=sock)
    except OSError as exc:
        _fail(f"cannot listen on {settings.host}:{settings.port}: {exc}")
    raise typer.Exit(status)


@db_app.command("upgrade")
def db_upgrade(revision: str = typer.Argument("head")) -> None:
    """Create or upgrade the schema to ``revision``."""
    from service.store.db import masked_url, upgrade

    settings = Settings()
    upgrade(settings.resolved_database_url, revision)
    typer.echo(f"database at {masked_url(settings.resolved_database_url)} is at {revision}")


def main() -> None:
    """Run the command line. The client commands are added unless the command is one of
    ``SERVER_COMMANDS`` (so ``--help`` lists every command)."""
    args = sys.argv[1:]
    if not args or args[0] not in SERVER_COMMANDS:
        from service.client.commands import register as register_client_commands

        register_client_commands(app)
    app(args=args)
