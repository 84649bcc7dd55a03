"""``torchyard sweep``: create a sweep from a file (and follow it live), show one, cancel one
(docs/sweeps.md). Exit codes as for jobs: 0 succeeded, 1 failed, 3 cancelled, 4 still running
at ``--timeout``, 5 refused or unreachable."""

import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.live import Live
from rich.table import Table

from service.client.options import (
    DEFAULT_URL,
    EXIT_TIMEOUT,
    STATE_EXIT,
    TokenOpt,
    UrlOpt,
    connect,
    console,
)
from service.client.specfile import load_spec_file

sweep_app = typer.Typer(help="Sweeps: many trials of one spec (docs/sweeps.md).",
                        no_args_is_help=True)
SweepArg = Annotated[int, typer.Argument(min=1, help="sweep id")]
FOLLOW_POLL_S = 1.0


def _value(value: float | None) -> str:
    return "-" if value is None else f"{value:.6g}"


def sweep_table(sweep: dict[str, Any]) -> Table:
    """The sweep's header line as the title; one row per trial; the best one marked."""
    counts = sweep["counts"]
    best = sweep.get("best") or {}
    title = (f"sweep {sweep['id']} {sweep['name']}: {sweep['state']} · "
             f"running {counts['running'] + counts['queued']} · completed {counts['completed']} · "
             f"pruned {counts['pruned']} · failed {counts['failed']} · best "
             f"{_value(best.get('value'))}" + (f" (job {best['job_id']})" if best else ""))
    table = Table(title=title, title_justify="left")
    for column in ("job", "params", "state", "outcome", "epochs", "value", ""):
        table.add_column(column)
    for t in sweep["trials"]:
        params = ", ".join(f"{k}={_value(v) if isinstance(v, float) else v}"
                           for k, v in sorted(t["params"].items()))
        table.add_row(str(t["job_id"]), params, t["state"], t["outcome"] or "-",
                      str(len(t["epochs"])), _value(t["value"]),
                      "best" if best and t["job_id"] == best.get("job_id") else "")
    return table


def _exit(sweep: dict[str, Any]) -> None:
    raise typer.Exit(STATE_EXIT.get(sweep["state"], EXIT_TIMEOUT))


@sweep_app.command()
def create(
    spec_file: Annotated[Path, typer.Argument(exists=True, dir_okay=False, readable=True,
                                              help="the sweep, .json or .yaml")],
    follow: Annotated[bool, typer.Option("--follow", help="a live table until it ends")] = False,
    timeout: Annotated[float | None, typer.Option(min=0, help="--follow: give up after s")] = None,
    url: UrlOpt = DEFAULT_URL,
    token: TokenOpt = None,
) -> None:
    """Create a sweep; with --follow, show its trials live and exit with its outcome."""
    with connect(url, token) as client:
        sweep = client.create_sweep(load_spec_file(spec_file))
        console.print(f"sweep {sweep['id']} created")
        if not follow:
            return
        deadline = None if timeout is None else time.monotonic() + timeout
        with Live(sweep_table(sweep), console=console, refresh_per_second=2) as live:
            while sweep["state"] == "running":
                if deadline is not None and time.monotonic() >= deadline:
                    break
                time.sleep(FOLLOW_POLL_S)
                sweep = client.sweep(sweep["id"])
                live.update(sweep_table(sweep))
    _exit(sweep)


@sweep_app.command()
def show(sweep_id: SweepArg, url: UrlOpt = DEFAULT_URL, token: TokenOpt = None) -> None:
    """The sweep: its state, counts, best trial and every trial."""
    with connect(url, token) as client:
        console.print(sweep_table(client.sweep(sweep_id)))


@sweep_app.command()
def cancel(sweep_id: SweepArg, url: UrlOpt = DEFAULT_URL, token: TokenOpt = None) -> None:
    """Cancel the sweep and its queued and running trials."""
    with connect(url, token) as client:
        sweep = client.cancel_sweep(sweep_id)
    console.print(f"sweep {sweep['id']}: {sweep['state']}")
