"""``torchyard tensorboard JOB... -o DIR``: fetch jobs' TensorBoard event files (the server writes
them from every rank's records: docs/tracking.md) into ``DIR/<name>-<id>/``, one run per job in
TensorBoard; ``--serve`` then runs a local TensorBoard on ``DIR`` and fetches what is new every
``REFRESH_S`` until Ctrl-C, so running jobs' curves grow as they train.
"""

import shutil
import subprocess
import time
from pathlib import Path
from typing import Annotated

import typer

from service.client.api import TorchyardClient
from service.client.options import (
    DEFAULT_URL,
    EXIT_ERROR,
    TokenOpt,
    UrlOpt,
    connect,
    err_console,
)
from torchyard_contract.confinement import PathRefused, relative_parts

PREFIX = "tensorboard/"
REFRESH_S = 10.0


def _local_path(root: Path, path: str) -> Path | None:
    """Where the artifact ``tensorboard/...`` goes under ``root``; None for a path that would
    leave it (the server never lists one; a client does not trust that)."""
    try:  # the untrusted trees' rule (torchyard_contract.confinement)
        return root.joinpath(*relative_parts(path.removeprefix(PREFIX)))
    except PathRefused:
        return None


def fetch(client: TorchyardClient, job_id: int, output: Path) -> int:
    """Download the job's event files that are new or grew, and remove local ones the server
    no longer has (it rewrites a job's files after a restart); returns how many were fetched."""
    job = client.job(job_id)
    root = output / f"{job['name']}-{job_id}"
    fetched, after, listed = 0, None, set()
    while True:
        page = client.artifacts(job_id, after)
        for item in page["items"]:
            target = _local_path(root, item["path"]) if item["path"].startswith(PREFIX) else None
            if target is not None:
                listed.add(target)
            if target is None or (target.exists() and target.stat().st_size == item["size"]):
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            partial = target.with_name(f".{target.name}.part")
            with partial.open("wb") as out:
                client.download(job_id, item["path"], out)
            partial.replace(target)
            fetched += 1
        after = page["next_after"]
        if after is None:
            break
    for stale in (p for p in root.rglob("*") if p.is_file() and p not in listed):
        stale.unlink()
    return fetched


def tensorboard(
    job_ids: Annotated[list[int], typer.Argument(min=1, help="job ids")],
    output: Annotated[Path, typer.Option(
        "--output", "-o", help="directory: one folder per job, <name>-<id>")] = Path("tensorboard"),
    serve: Annotated[bool, typer.Option(
        "--serve", help="then run TensorBoard on the directory, fetching new event files every "
        f"{REFRESH_S:g} s until Ctrl-C (needs `pip install tensorboard`)")] = False,
    port: Annotated[int, typer.Option(min=1, max=65535, help="TensorBoard's port")] = 6006,
    url: UrlOpt = DEFAULT_URL,
    token: TokenOpt = None,
) -> None:
    """Fetch jobs' TensorBoard event files (every rank's scalars and their mean)."""
    program = shutil.which("tensorboard") if serve else None
    if serve and program is None:
        err_console.print("[red]error[/]: --serve needs TensorBoard: pip install tensorboard")
        raise typer.Exit(EXIT_ERROR)
    with connect(url, token) as client:
        for job_id in job_ids:
            count = fetch(client, job_id, output)
            err_console.print(f"job {job_id}: {count} event files into {output}")
        if program is None:
            return
        board = subprocess.Popen([program, "--logdir", str(output), "--port", str(port)])
        try:
            while board.poll() is None:
                time.sleep(REFRESH_S)
                for job_id in job_ids:
                    fetch(client, job_id, output)
        except KeyboardInterrupt:
            pass
        finally:
            board.terminate()
            board.wait(timeout=10)
