"""Client commands of ``torchyard``, registered on the main typer app by :func:`register`.

The options, exit codes and connection every command shares are in ``service.client.options``
(``wait`` and ``submit --follow`` exit with the job's outcome: 0 succeeded, 1 failed,
3 cancelled, 4 still not finished at ``--timeout``).
"""

import json
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import Progress

from service.client import render
from service.client.api import TERMINAL, TorchyardClient
from service.client.follow import follow
from service.client.identity import register as register_identity
from service.client.options import (
    DEFAULT_URL,
    EXIT_FAILED,
    EXIT_TIMEOUT,
    JobArg,
    TokenOpt,
    UrlOpt,
    connect,
    console,
    err_console,
    exit_for,
    print_job_line,
)
from service.client.pausecommands import pause, resume
from service.client.specfile import load_spec_file, parse_pairs, yaml_value
from service.client.sweep import sweep_app
from service.client.tensorboard import tensorboard
from service.client.workdir import pack

LOG_POLL_S = 0.5
PROGRESS_MIN_BYTES = 8 * 1024 * 1024  # a progress bar for uploads this big


def submit(
    target: Annotated[
        str | None, typer.Argument(
            metavar="[SPEC_FILE | ENTRYPOINT]",
            help="JSON or YAML job spec; with --workdir: the script (or '-m pkg.mod') inside it")
    ] = None,
    script_args: Annotated[
        list[str] | None, typer.Argument(help="with --workdir: the script's arguments, after --")
    ] = None,
    workdir: Annotated[
        Path | None, typer.Option(
            exists=True, file_okay=False, help="pack this directory (honouring its .gitignore), "
            "upload it unless the server has it, and run ENTRYPOINT inside it")
    ] = None,
    exclude: Annotated[
        list[str], typer.Option(help="with --workdir: shell pattern to leave out, repeatable")
    ] = [],  # noqa: B006
    name: Annotated[str | None, typer.Option(help="job name")] = None,
    model: Annotated[str | None, typer.Option(help="mlp | cnn | resnet18")] = None,
    dataset: Annotated[str | None, typer.Option(help="digits | synthetic | mnist | ...")] = None,
    epochs: Annotated[int | None, typer.Option(min=1)] = None,
    batch_size: Annotated[int | None, typer.Option(min=1, help="per rank")] = None,
    lr: Annotated[float | None, typer.Option()] = None,
    nproc: Annotated[int | None, typer.Option("--nproc-per-node", "-n", min=1, help="ranks")] = None,
    priority: Annotated[int | None, typer.Option()] = None,
    label: Annotated[list[str], typer.Option(help="KEY=VALUE, repeatable")] = [],  # noqa: B006
    set_: Annotated[
        list[str], typer.Option("--set", help="any spec field as KEY=VALUE (YAML value)")
    ] = [],  # noqa: B006
    follow_: Annotated[
        bool, typer.Option("--follow", "-f", help="show progress until the job ends")
    ] = False,
    url: UrlOpt = DEFAULT_URL,
    token: TokenOpt = None,
) -> None:
    """Submit a job (spec file, then flags on top); with --follow, exit as `wait` does.

    With --workdir DIR ENTRYPOINT [-- ARGS]: DIR is packed and uploaded (only when HEAD says the
    server lacks it) and the job runs ENTRYPOINT in its own copy of it."""
    spec: dict[str, Any] = {}
    if workdir is None:
        if script_args:
            raise typer.BadParameter("script arguments need --workdir", param_hint="ARGS")
        if target is not None:
            spec_file = Path(target)
            if not spec_file.is_file():
                raise typer.BadParameter(f"{target} is not a file", param_hint="SPEC_FILE")
            spec = load_spec_file(spec_file)
    elif target is None:
        raise typer.BadParameter("--workdir needs the ENTRYPOINT to run", param_hint="ENTRYPOINT")
    flags = {"name": name, "model": model, "dataset": dataset, "epochs": epochs,
             "batch_size": batch_size, "lr": lr, "nproc_per_node": nproc, "priority": priority}
    spec.update({k: v for k, v in flags.items() if v is not None})
    spec.update({k: yaml_value(v) for k, v in parse_pairs(set_, "--set").items()})
    if label:
        spec["labels"] = {**spec.get("labels", {}), **parse_pairs(label, "--label")}
    with connect(url, token) as client:
        if workdir is not None:
            spec.update(entrypoint=target, package=_upload_workdir(client, workdir, exclude))
            if script_args:
                spec["args"] = list(script_args)
        job = client.submit(spec)
        print_job_line(job)
        if not follow_:
            return
        result = follow(client, job, console)
        final = client.job(job["id"])
        if result.final_loss:
            console.print(render.final_losses_table(result.final_loss))
        _warn_divergence(client, job["id"])
    print_job_line(final)
    raise typer.Exit(exit_for(final))


def _upload_workdir(client: TorchyardClient, workdir: Path, exclude: list[str]) -> str:
    """Pack ``workdir``; upload it unless the server has it; its digest."""
    archive, digest = pack(workdir, exclude)
    try:
        if client.has_package(digest):
            err_console.print(f"package {digest[:19]}… already on the server")
            return digest
        size = archive.stat().st_size
        with Progress(transient=True, console=err_console, disable=size < PROGRESS_MIN_BYTES) as bar:
            task = bar.add_task("uploading", total=size)

            def chunks() -> Iterator[bytes]:
                with archive.open("rb") as f:
                    while chunk := f.read(1024 * 1024):
                        bar.advance(task, len(chunk))
                        yield chunk

            info = client.upload_package(chunks(), size)
        err_console.print(f"uploaded {digest[:19]}… ({size} bytes, {info['files']} files)")
        return digest
    finally:
        archive.unlink(missing_ok=True)


def artifacts(
    job_id: JobArg,
    path: Annotated[str | None, typer.Argument(help="an artifact to download")] = None,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="file to write (default: its name)")
    ] = None,
    url: UrlOpt = DEFAULT_URL,
    token: TokenOpt = None,
) -> None:
    """List a job's artifacts, or download one (JOB PATH -o FILE)."""
    with connect(url, token) as client:
        if path is None:
            after = None
            while True:
                page = client.artifacts(job_id, after)
                for item in page["items"]:
                    console.print(f"{item['size']:>12}  {item['path']}", highlight=False)
                after = page["next_after"]
                if after is None:
                    return
        target = output or Path(path.rsplit("/", 1)[-1])
        tmp = target.with_name(f".{target.name}.part")
        with tmp.open("wb") as out:
            written = client.download(job_id, path, out)
        tmp.replace(target)
    err_console.print(f"wrote {target} ({written} bytes)")


def delete(job_id: JobArg, url: UrlOpt = DEFAULT_URL, token: TokenOpt = None) -> None:
    """Delete a finished job with its records, logs, run directory and outputs."""
    with connect(url, token) as client:
        client.delete(job_id)
    console.print(f"job {job_id} deleted")


def _warn_divergence(client: TorchyardClient, job_id: int) -> None:
    items = client.summary(job_id)["items"]
    flagged = [(i["epoch"], i["diverged_ranks"]) for i in items if i["diverged_ranks"]]
    if flagged:
        where = "; ".join(f"epoch {e}: rank {','.join(map(str, r))}" for e, r in flagged[-5:])
        console.print(f"[bold red]ranks diverged[/] ({where}); see `torchyard summary {job_id}`")


def jobs(
    state: Annotated[str | None, typer.Option(help="queued|starting|running|succeeded|...")] = None,
    name: Annotated[str | None, typer.Option()] = None,
    label: Annotated[str | None, typer.Option(help="KEY=VALUE")] = None,
    owner: Annotated[str | None, typer.Option(help="submitted by this user")] = None,
    team: Annotated[str | None, typer.Option(help="of this team")] = None,
    limit: Annotated[int, typer.Option(min=1, max=500)] = 20,
    url: UrlOpt = DEFAULT_URL,
    token: TokenOpt = None,
) -> None:
    """List jobs, newest first (a member or viewer sees their team's)."""
    with connect(url, token) as client:
        page = client.jobs(state=state, name=name, label=label, owner=owner, team=team,
                           limit=limit)
    console.print(render.jobs_table(page["items"]))


def show(job_id: JobArg, url: UrlOpt = DEFAULT_URL, token: TokenOpt = None) -> None:
    """One job: fields, spec, attempts, and the loss summary's last epoch."""
    with connect(url, token) as client:
        job = client.job(job_id)
        summary = client.summary(job_id)
    console.print(render.job_table(job))
    if job.get("attempts"):
        console.print(render.attempts_table(job["attempts"]))
    if summary["items"]:
        console.print(render.summary_table({**summary, "items": summary["items"][-1:]}))


def metrics(
    job_id: JobArg,
    name: Annotated[str | None, typer.Option(help="only this metric")] = None,
    rank: Annotated[int | None, typer.Option(min=0, help="only this rank")] = None,
    follow_: Annotated[
        bool, typer.Option("--follow", "-f", help="print records as they arrive")
    ] = False,
    url: UrlOpt = DEFAULT_URL,
    token: TokenOpt = None,
) -> None:
    """The job's metric records (a table), or with --follow a line per record until it ends."""

    def wanted(m: dict[str, Any]) -> bool:
        return (name is None or m["name"] == name) and (rank is None or m["rank"] == rank)

    with connect(url, token) as client:
        if not follow_:
            items = client.all_metrics(job_id, name=name, rank=rank)
            console.print(render.metrics_table(items))
            return
        for event in client.events(job_id):
            if event.kind == "metric" and wanted(event.data):
                console.print(render.metric_line(event.data), highlight=False)
            elif event.kind == "state":
                print_job_line(event.data)


def logs(
    job_id: JobArg,
    rank: Annotated[int, typer.Option(min=0)] = 0,
    attempt: Annotated[int | None, typer.Option(min=1, help="default: latest")] = None,
    follow_: Annotated[
        bool, typer.Option("--follow", "-f", help="keep reading until the attempt ends")
    ] = False,
    stream: Annotated[
        str | None,
        typer.Option(help="one stream only: stdout (its prints) or stderr (logging, tracebacks)"),
    ] = None,
    url: UrlOpt = DEFAULT_URL,
    token: TokenOpt = None,
) -> None:
    """Everything a rank printed, stdout and stderr in the order written (or one --stream)."""
    offset = 0
    with connect(url, token) as client:
        while True:
            chunk = client.logs(job_id, rank, offset, attempt, stream)
            attempt = chunk["attempt"]  # stay on one attempt while following
            sys.stdout.write(chunk["text"])
            sys.stdout.flush()
            advanced = chunk["next_offset"] > offset
            offset = chunk["next_offset"]
            if chunk["complete"] or (not follow_ and not advanced):
                return
            if not advanced:
                time.sleep(LOG_POLL_S)


def stacks(
    job_id: JobArg,
    attempt: Annotated[
        int | None, typer.Option(min=1, help="the stacks kept at this attempt's hang")
    ] = None,
    json_: Annotated[bool, typer.Option("--json", help="the API's answer as JSON")] = False,
    url: UrlOpt = DEFAULT_URL,
    token: TokenOpt = None,
) -> None:
    """Where every rank is: its Python stacks (all threads), in a collective or elsewhere."""
    with connect(url, token) as client:
        answer = client.stacks(job_id, attempt)
    if json_:
        print(json.dumps(answer, indent=2))
        return
    console.print(render.stacks_text(answer), highlight=False)


def cancel(job_id: JobArg, url: UrlOpt = DEFAULT_URL, token: TokenOpt = None) -> None:
    """Cancel a queued or running job (a finished job is left as it is)."""
    with connect(url, token) as client:
        print_job_line(client.cancel(job_id))


def wait(
    job_id: JobArg,
    timeout: Annotated[
        float | None, typer.Option(min=0, help="seconds; default: no limit")
    ] = None,
    url: UrlOpt = DEFAULT_URL,
    token: TokenOpt = None,
) -> None:
    """Wait for the job to end. Exit 0 succeeded, 1 failed, 3 cancelled, 4 timeout, 5 error."""
    with connect(url, token) as client:
        job = client.wait(job_id, timeout)
    print_job_line(job)
    raise typer.Exit(exit_for(job) if job["state"] in TERMINAL else EXIT_TIMEOUT)


def summary(
    job_id: JobArg,
    name: Annotated[str, typer.Option(help="per-epoch metric")] = "loss",
    threshold: Annotated[
        float | None, typer.Option(min=0, help="relative distance that flags a rank")
    ] = None,
    fail_on_divergence: Annotated[
        bool, typer.Option(help="exit 1 when any rank diverged (for CI)")
    ] = False,
    url: UrlOpt = DEFAULT_URL,
    token: TokenOpt = None,
) -> None:
    """Per epoch across ranks: mean/min/max/std and ranks that diverge from the others."""
    with connect(url, token) as client:
        body = client.summary(job_id, name, threshold)
    console.print(render.summary_table(body))
    if fail_on_divergence and any(i["diverged_ranks"] for i in body["items"]):
        raise typer.Exit(EXIT_FAILED)


COMMANDS: list[Callable[..., None]] = [
    submit, jobs, show, metrics, logs, stacks, cancel, wait, summary, artifacts, delete,
    tensorboard,
]


def register(app: typer.Typer) -> None:
    """Add the client commands to the ``torchyard`` app."""
    for command in COMMANDS:
        app.command()(command)
        for after_cancel in (pause, resume) if command is cancel else ():
            app.command()(after_cancel)

    app.add_typer(sweep_app, name="sweep")
    register_identity(app)
