"""Follow a job's event stream with a progress bar over epochs × ranks and the live loss."""

import statistics
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from service.client.api import TorchyardClient
from service.client.render import fmt_value, job_line
from torchyard_contract.attempts import spec_world_size


@dataclass
class FollowResult:
    job: dict[str, Any]
    final_loss: dict[int, dict[str, Any]] = field(default_factory=dict)  # rank → loss record


def follow(client: TorchyardClient, job: dict[str, Any], console: Console) -> FollowResult:
    """Show the job until it ends; returns its final body and each rank's latest loss record.

    Progress counts (rank, epoch) pairs with a ``loss`` record, whatever the attempt, so a
    restarted job that re-reports epochs does not count them twice.
    """
    spec = job.get("spec", {})
    ranks = spec_world_size(spec)  # every node's ranks report
    epochs = spec.get("epochs")
    result = FollowResult(job=job)
    done: set[tuple[int, int]] = set()
    by_epoch: dict[tuple[int, int], dict[int, float]] = {}  # (attempt, epoch) → rank → loss
    columns = [
        TextColumn("[bold]job {task.fields[job_id]}[/] {task.fields[state]}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[loss]}"),
        TimeElapsedColumn(),
    ]
    with Progress(*columns, console=console) as progress:
        task = progress.add_task(
            "train", total=epochs * ranks if isinstance(epochs, int) else None,
            job_id=job["id"], state=job["state"], loss="",
        )
        for event in client.events(job["id"]):
            if event.kind == "state":
                result.job = event.data
                progress.update(task, state=event.data["state"])
                console.print(job_line(event.data), highlight=False)
                continue
            m = event.data
            if m["name"] != "loss" or m["step"] is not None:
                continue
            done.add((m["rank"], m["epoch"]))
            previous = result.final_loss.get(m["rank"])
            if previous is None or (m["attempt"], m["epoch"]) >= (
                previous["attempt"], previous["epoch"]
            ):
                result.final_loss[m["rank"]] = m
            epoch_losses = by_epoch.setdefault((m["attempt"], m["epoch"]), {})
            epoch_losses[m["rank"]] = m["value"]
            finite = [v for v in epoch_losses.values() if isinstance(v, float | int)]
            loss = f"epoch {m['epoch']} loss {fmt_value(statistics.fmean(finite))}" if finite else ""
            progress.update(task, completed=len(done), loss=loss)
            if len(epoch_losses) == ranks:
                values = " ".join(f"r{r}={fmt_value(v)}" for r, v in sorted(epoch_losses.items()))
                console.print(f"epoch {m['epoch']} (attempt {m['attempt']}): loss {values}")
    return result
