"""What every client command shares: the server URL and token options, the job argument, the exit
codes, the consoles, and one way to talk to the server (:func:`connect`).

Server URL and token: ``--url``/``--token`` or ``TORCHYARD_URL``/``TORCHYARD_TOKEN`` (default
``http://127.0.0.1:8000``, no token). Exit codes: 0 succeeded, 1 failed, 3 cancelled, 4 still
not finished at ``--timeout``, 5 the server refused a request or cannot be reached, 2 bad usage.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Any

import typer
from rich.console import Console

from service.client import render
from service.client.api import ClientError, TorchyardClient

EXIT_OK, EXIT_FAILED, EXIT_CANCELLED, EXIT_TIMEOUT, EXIT_ERROR = 0, 1, 3, 4, 5
STATE_EXIT = {"succeeded": EXIT_OK, "failed": EXIT_FAILED, "cancelled": EXIT_CANCELLED}
DEFAULT_URL = "http://127.0.0.1:8000"

UrlOpt = Annotated[str, typer.Option("--url", envvar="TORCHYARD_URL", help="server URL")]
TokenOpt = Annotated[
    str | None, typer.Option("--token", envvar="TORCHYARD_TOKEN", help="API token (Bearer)")
]
JobArg = Annotated[int, typer.Argument(min=1, help="job id")]

console = Console()
err_console = Console(stderr=True)


@contextmanager
def connect(url: str, token: str | None) -> Iterator[TorchyardClient]:
    """A client; a refused request or an unreachable server prints one line and exits 5."""
    try:
        with TorchyardClient(url, token) as client:
            yield client
    except ClientError as exc:
        err_console.print(f"[red]error[/] ({exc.status or '-'} {exc.error}): {exc.message}")
        raise typer.Exit(EXIT_ERROR) from None


def exit_for(job: dict[str, Any]) -> int:
    return STATE_EXIT.get(job["state"], EXIT_TIMEOUT)


def print_job_line(job: dict[str, Any]) -> None:
    console.print(render.job_line(job), highlight=False)
