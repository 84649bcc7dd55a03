"""Turning a finished group into a human reason: first failing rank's exception, else the log tail."""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path

LOG_TAIL_LINES = 20


def _first_rank_error(run_logs: Path) -> str | None:
    """torchrun writes each failed rank's ``@record`` error file under its log dir."""
    best: tuple[int, str] | None = None
    for path in run_logs.glob("**/error.json"):
        try:
            data = json.loads(path.read_text())
            ts = path.stat().st_mtime_ns
        except (OSError, ValueError):
            continue
        message = data.get("message")
        if isinstance(message, dict):
            text = str(message.get("message", "")).strip()
        else:
            text = str(message or "").strip()
        # Ordered by the file's mtime, not the recorded timestamp: that one has whole seconds,
        # and the peers of a failed rank fail within the same second ("Connection closed").
        rank = path.parent.name
        line = text.splitlines()[-1] if text else "unknown error"
        entry = f"rank {rank} failed: {line}"
        if best is None or ts < best[0]:
            best = (ts, entry)
    return best[1] if best else None


def _tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.strip().splitlines()[-lines:])


# torchrun's failure summary: "rank      : 1 (local_rank: 1)" then "exitcode  : -9 (pid: ...)".
_SUMMARY_RANK = re.compile(
    r"^\s*rank\s*:\s*(\d+)\s*\(local_rank.*\n\s*exitcode\s*:\s*(-?\d+)", re.MULTILINE
)


def failed_rank_exit_codes(torchrun_log: Path) -> dict[int, int]:
    """Ranks torchrun reported as failed in this attempt's log, with their exit codes."""
    try:
        text = torchrun_log.read_text(errors="replace")
    except OSError:
        return {}
    return {int(rank): int(code) for rank, code in _SUMMARY_RANK.findall(text)}


def describe_exit(exit_code: int, logs_dir: Path, launcher_log: Path) -> str:
    if exit_code < 0:
        try:
            name = signal.Signals(-exit_code).name
        except ValueError:
            name = f"signal {-exit_code}"
        prefix = f"torchrun killed by {name}"
    else:
        prefix = f"torchrun exited with code {exit_code}"
    rank_error = _first_rank_error(logs_dir)
    if rank_error:
        return f"{rank_error} ({prefix})"
    tail = _tail(launcher_log)
    return f"{prefix}; last output:\n{tail}" if tail else prefix
