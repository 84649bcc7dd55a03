"""Turning a finished group into a human reason: first failing rank's exception, else the log tail.

Everything read here was written by the job (error files, logs), so it is read bounded
(``torchyard_contract.safefile``) and the reason is cut to ``REASON_MAX_CHARS`` (``torchyard_contract.bounds``); the
full text stays in the rank's log.
"""

import json
import re
import signal
from pathlib import Path

from torchyard_contract.bounds import REASON_MAX_CHARS, WHERE_FULL_TEXT, bounded_line, bounded_text
from torchyard_contract.safefile import open_regular, read_bytes, read_tail

LOG_TAIL_LINES = 20
ERROR_FILE_MAX_BYTES = 16 * 1024 * 1024  # torch writes the whole exception message into it
ERROR_FILES_MAX = 1024  # error files looked at per attempt (one per rank, normally)


def _first_rank_error(run_logs: Path) -> str | None:
    """torchrun writes each failed rank's ``@record`` error file under its log dir."""
    best: tuple[int, str] | None = None
    for index, path in enumerate(run_logs.glob("**/error.json")):
        if index >= ERROR_FILES_MAX:
            break
        raw = read_bytes(path, ERROR_FILE_MAX_BYTES)
        try:
            ts = path.stat().st_mtime_ns
            data = json.loads(raw) if raw is not None else None
        except (OSError, ValueError):
            continue
        if raw is None:  # too large to parse (or not a regular file): its start will do
            data = {"message": _message_start(path)}
        if not isinstance(data, dict):
            continue
        message = data.get("message")
        if isinstance(message, dict):
            text = str(message.get("message", "")).strip()
        else:
            text = str(message or "").strip()
        # Ordered by the file's mtime, not the recorded timestamp: that one has whole seconds,
        # and the peers of a failed rank fail within the same second ("Connection closed").
        rank = bounded_line(path.parent.name)
        line = text.splitlines()[-1] if text else "unknown error"
        # Room left for the exit description that follows it.
        entry = bounded_text(f"rank {rank} failed: {line}", REASON_MAX_CHARS - 200)
        if best is None or ts < best[0]:
            best = (ts, entry)
    return best[1] if best else None


_MESSAGE_START = re.compile(rb'"message"\s*:\s*"((?:[^"\\]|\\.){1,300})')


def _message_start(path: Path) -> str:
    """The first characters of the message in an error file too large to parse."""
    f = open_regular(path)
    if f is None:
        return "unreadable error file"
    with f:
        head = f.read(4096)
    match = _MESSAGE_START.search(head)
    if match is None:
        return "error file too large to read"
    try:
        text = json.loads(b'"' + match[1] + b'"')
    except ValueError:
        text = match[1].decode("utf-8", errors="replace")
    return f"{text}… [{WHERE_FULL_TEXT}]"


def _tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of the file's end, each cut to ``LOG_LINE_MAX_CHARS``."""
    text = read_tail(path)
    return "\n".join(bounded_line(line) for line in text.strip().splitlines()[-lines:])


# torchrun's failure summary: "rank      : 1 (local_rank: 1)" then "exitcode  : -9 (pid: ...)".
_SUMMARY_RANK = re.compile(
    r"^\s*rank\s*:\s*(\d{1,9})\s*\(local_rank.*\n\s*exitcode\s*:\s*(-?\d{1,9})\b", re.MULTILINE
)


def failed_rank_exit_codes(torchrun_log: Path) -> dict[int, int]:
    """Ranks torchrun reported as failed in this attempt's log, with their exit codes."""
    text = read_tail(torchrun_log)  # the summary is at the end
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
        return bounded_text(f"{rank_error} ({prefix})")
    tail = _tail(launcher_log)
    return bounded_text(f"{prefix}; last output:\n{tail}" if tail else prefix)
