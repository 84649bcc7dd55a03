"""Turning a finished group into a human reason: first failing rank's exception, else the log tail.

Everything read here was written by the job (error files, logs), so it is read bounded
(``torchyard_contract.safefile``) and the reason is cut to ``REASON_MAX_CHARS`` (``torchyard_contract.bounds``); the
full text stays in the rank's log.
"""

import json
import os
import re
import signal
from pathlib import Path

from torchyard_contract.bounds import REASON_MAX_CHARS, WHERE_FULL_TEXT, bounded_line, bounded_text
from torchyard_contract.nodes import global_rank
from torchyard_contract.safefile import open_regular, read_bytes, read_tail

LOG_TAIL_LINES = 20
ERROR_FILE_MAX_BYTES = 16 * 1024 * 1024  # torch writes the whole exception message into it
ERROR_FILES_MAX = 1024  # error files looked at per attempt (one per rank, normally)


def _first_rank_error(run_logs: Path, nproc_per_node: int) -> str | None:
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
        rank = _global_rank(path.relative_to(run_logs), nproc_per_node)
        line = text.splitlines()[-1] if text else "unknown error"
        # Room left for the exit description that follows it.
        entry = bounded_text(f"rank {rank} failed: {line}", REASON_MAX_CHARS - 200)
        if best is None or ts < best[0]:
            best = (ts, entry)
    return best[1] if best else None


# torchrun's layout under the attempt's log dir: ``<run id>_<random>/attempt_<restart>/<local
# rank>/error.json`` (torch.distributed.elastic's ``DefaultLogsSpecs``), a directory named by the
# rank on its node, not the job; on Slurm below ``node-<node rank>/`` (``service.run.srun``).
_LOCAL_RANK = re.compile(r"[0-9]{1,6}")
_NODE_DIR = re.compile(r"node-([0-9]{1,6})")


def _global_rank(error_file: Path, nproc_per_node: int) -> str:
    """The job's rank that wrote ``error_file`` (relative to the attempt's log dir): the local
    rank, which is the global one with one torchrun; with one per node (static rendezvous,
    node-major: ``torchyard_contract.nodes``) node ``k``'s local rank ``l`` is
    ``k * nproc_per_node + l``. Any other layout: the directory's name, as it is."""
    parts = error_file.parts
    local = parts[-2] if len(parts) >= 2 else ""
    if not _LOCAL_RANK.fullmatch(local):
        return bounded_line(local)
    node = _NODE_DIR.fullmatch(parts[0]) if len(parts) == 5 else None
    if node is None:
        return str(int(local))
    return str(global_rank(int(node[1]), int(local), nproc_per_node))


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


def describe_exit(
    exit_code: int, logs_dir: Path, torchrun_log: Path, nproc_per_node: int = 1
) -> str:
    """The attempt's reason: the first failing rank's exception, named by its global rank
    (``nproc_per_node``: where a job has a torchrun per node), else the exit and log tail."""
    if exit_code < 0:
        try:
            name = signal.Signals(-exit_code).name
        except ValueError:
            name = f"signal {-exit_code}"
        prefix = f"torchrun killed by {name}"
    else:
        prefix = f"torchrun exited with code {exit_code}"
    rank_error = _first_rank_error(logs_dir, nproc_per_node)
    if rank_error:
        return bounded_text(f"{rank_error} ({prefix})")
    tail = _tail(torchrun_log)
    return bounded_text(f"{prefix}; last output:\n{tail}" if tail else prefix)


# torchrun's static rendezvous binds rank 0's store on a port the launcher found free a moment
# earlier (``service.run.socketport``); another process on the host may take it in between.
PORT_TAKEN = re.compile(rb"server socket has failed to listen.*EADDRINUSE", re.IGNORECASE)
PORT_TAKEN_TAIL_BYTES = 64 * 1024


def log_sizes(logs: list[Path]) -> dict[Path, int]:
    """Each log's size now (0 for one not yet written): where a later start's output begins."""
    sizes = {}
    for log in logs:
        try:
            sizes[log] = log.stat().st_size
        except OSError:
            sizes[log] = 0
    return sizes


def rendezvous_port_taken(logs: list[Path], since: dict[Path, int]) -> bool:
    """Whether torchrun's output after ``since`` (:func:`log_sizes` at the start) says the
    rendezvous store could not listen because its port was taken (EADDRINUSE). Reads at most
    ``PORT_TAKEN_TAIL_BYTES`` of each log, from where this start's output begins."""
    for log in logs:
        f = open_regular(log)
        if f is None:
            continue
        try:
            with f:
                size = os.fstat(f.fileno()).st_size
                f.seek(max(since.get(log, 0), size - PORT_TAKEN_TAIL_BYTES))
                new = f.read(PORT_TAKEN_TAIL_BYTES)
        except OSError:
            continue
        if PORT_TAKEN.search(new.replace(b"\n", b" ")):
            return True
    return False
