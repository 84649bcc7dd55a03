"""Rich renderings of API bodies: tables for jobs, metrics, summaries and final losses."""

import math
from datetime import UTC, datetime
from typing import Any

from rich.table import Table
from rich.text import Text

STATE_STYLES = {
    "queued": "yellow", "starting": "cyan", "running": "blue",
    "succeeded": "green", "failed": "red", "cancelled": "magenta",
}


def fmt_value(value: float | str | None) -> str:
    """A metric value: 4 decimals, scientific when tiny or huge; non-finite as sent ("NaN")."""
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    if value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e6) and math.isfinite(value):
        return f"{value:.3e}"
    return f"{value:.4f}"


def state_text(state: str) -> Text:
    return Text(state, style=STATE_STYLES.get(state, ""))


def job_line(job: dict[str, Any]) -> Text:
    """``job 7 failed: <reason>``: the state and, when there is one, why."""
    reason = f": {job['reason']}" if job.get("reason") else ""
    return Text.assemble(f"job {job['id']} ", state_text(job["state"]), reason)


def _age(iso: str | None) -> str:
    if not iso:
        return "-"
    then = datetime.fromisoformat(iso)
    then = then if then.tzinfo else then.replace(tzinfo=UTC)
    seconds = int((datetime.now(UTC) - then).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{max(seconds, 0)}s"


def jobs_table(jobs: list[dict[str, Any]]) -> Table:
    table = Table("id", "name", "state", "owner", "team", "ranks", "epochs", "age", "labels",
                  "reason")
    for job in jobs:
        spec = job.get("spec", {})
        labels = ",".join(f"{k}={v}" for k, v in (spec.get("labels") or {}).items())
        table.add_row(
            str(job["id"]), job["name"], state_text(job["state"]),
            job.get("owner") or "-", job.get("team") or "-",
            str(spec.get("nproc_per_node", "-")), str(spec.get("epochs", "-")),
            _age(job.get("created_at")), labels, Text((job.get("reason") or "")[:60]),
        )
    return table


def job_table(job: dict[str, Any]) -> Table:
    """Key/value view of one job, then its spec fields."""
    table = Table("field", "value", show_header=False)
    for key in ("id", "name", "state", "created_at", "started_at", "running_at", "first_metric_at",
                "ended_at",
                "exit_code", "reason", "devices", "queue_position", "waiting_reason"):
        if key in job:
            value = job[key]
            shown = state_text(value) if key == "state" else Text("-" if value is None else str(value))
            table.add_row(key, shown)
    if job.get("exclude_nodes"):  # retry_elsewhere on Slurm: the nodes its restarts leave out
        table.add_row("exclude_nodes", Text(", ".join(job["exclude_nodes"])))
    for key, value in job.get("spec", {}).items():
        table.add_row(f"spec.{key}", Text(str(value)))
    return table


def attempts_table(attempts: list[dict[str, Any]]) -> Table:
    table = Table("attempt", "exit", "rank exits", "reason")
    for a in attempts:
        codes = " ".join(f"{r}:{c}" for r, c in sorted((a.get("rank_exit_codes") or {}).items()))
        reason = a.get("reason") or ""
        if (a.get("decision") or {}).get("summary"):  # retry rules: what was decided, and why
            reason = f"{a['decision']['summary']} — {reason}"
        table.add_row(str(a["number"]), str(a.get("exit_code", "-")), codes, Text(reason[:120]))
    return table


def metrics_table(items: list[dict[str, Any]]) -> Table:
    table = Table("seq", "attempt", "rank", "epoch", "step", "name", "value")
    for m in items:
        table.add_row(
            str(m["seq"]), str(m["attempt"]), str(m["rank"]), str(m["epoch"]),
            "-" if m["step"] is None else str(m["step"]), m["name"], fmt_value(m["value"]),
        )
    return table


def metric_line(m: dict[str, Any]) -> str:
    step = "" if m["step"] is None else f" step {m['step']}"
    return (f"attempt {m['attempt']} rank {m['rank']} epoch {m['epoch']}{step} "
            f"{m['name']} {fmt_value(m['value'])}")


def summary_table(summary: dict[str, Any]) -> Table:
    """Per epoch across ranks; a diverging rank's value is red and marked with ``!``."""
    ranks = sorted({int(r) for item in summary["items"] for r in item["ranks"]})
    table = Table(
        "epoch", "mean", "min", "max", "std", *[f"rank {r}" for r in ranks], "diverged",
        title=f"{summary['name']} across ranks (threshold {summary['threshold']})",
    )
    for item in summary["items"]:
        diverged = set(item["diverged_ranks"])
        cells = [
            Text(fmt_value(item["ranks"][str(r)]) + (" !" if r in diverged else ""),
                 style="bold red" if r in diverged else "")
            if str(r) in item["ranks"] else Text("-")
            for r in ranks
        ]
        table.add_row(
            str(item["epoch"]), fmt_value(item["mean"]), fmt_value(item["min"]),
            fmt_value(item["max"]), fmt_value(item["std"]), *cells,
            Text(",".join(map(str, sorted(diverged))), style="bold red"),
        )
    return table


def final_losses_table(latest: dict[int, dict[str, Any]]) -> Table:
    """``rank → its latest loss record``."""
    table = Table("rank", "attempt", "epoch", "loss", title="final loss per rank")
    for rank in sorted(latest):
        m = latest[rank]
        table.add_row(str(rank), str(m["attempt"]), str(m["epoch"]), fmt_value(m["value"]))
    return table


def stacks_text(answer: dict[str, Any]) -> str:
    """``torchyard stacks``: each rank's state and where, then its threads innermost first."""
    lines = [f"attempt {answer['attempt']} ({answer['trigger']}, took {answer.get('took_s')} s)"]
    if answer.get("error"):
        lines.append(f"stacks not taken: {answer['error']}")
    for rank in answer.get("ranks", []):
        state = rank["state"]
        if state == "collective":
            state = f"waiting in {rank['collective']}"
        elif state == "elsewhere":
            state = "not in a collective"
        where = f", at {rank['where']}" if rank.get("where") else ""
        lines.append(f"rank {rank['rank']} (pid {rank.get('pid')}): {state}{where}")
        if rank.get("error"):
            lines.append(f"  {rank['error']}")
        for thread in rank.get("threads", []):
            lines.append(f"  thread {thread['name']}{' (active)' if thread['active'] else ''}")
            lines += [f"    {f['name']} ({f['file']}:{f['line']})" for f in thread["frames"]]
    return "\n".join(lines)
