"""``GET /jobs/{id}/logs``: a rank's log, read from a byte offset, so a client can follow it.

The executor says where the file is (``Executor.rank_log``). By default (``stream=combined``)
everything the rank wrote — its prints (stdout) and its logging and tracebacks (stderr) — in
the order written; ``stream=stdout`` or ``stream=stderr`` reads one stream. An attempt launched
before combined files existed is read as its ``stderr`` once it is over (the answer's ``stream``
says which). Every path part comes from an integer or a fixed name; no client string reaches
the filesystem.

A follower that starts late asks for ``?tail=N`` (the last N bytes) rather than reading a long
log from offset 0, then follows with ``next_offset``; ``offset`` in the answer says where the text
starts, so earlier parts can be fetched on demand with ``offset``/``limit``.
"""

import codecs
import os
from enum import Enum
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, Field

from service.api.deps import JobDep
from service.api.errors import ERROR_RESPONSES, ApiError
from service.executor.base import Executor
from torchyard_contract.attempts import spec_world_size
from torchyard_contract.rundir import RunDir
from torchyard_contract.safefile import open_regular
from torchyard_contract.state import TERMINAL_STATES, JobState

router = APIRouter(prefix="/jobs", tags=["logs"])
LOG_PAGE_DEFAULT = 64 * 1024
LOG_PAGE_MAX = 1024 * 1024
LOG_OFFSET_MAX = 2**53  # the largest integer a JSON client (JavaScript) holds exactly


class LogStream(str, Enum):
    combined = "combined"
    stderr = "stderr"
    stdout = "stdout"


class LogChunk(BaseModel):
    rank: int = Field(description="global rank (node-major: node = rank // nproc_per_node)")
    attempt: int
    node: str | None = Field(
        default=None,
        description="the node the rank ran on (slurm executor); absent on the local executor "
        "(this host) and before the rank started",
    )
    stream: LogStream = Field(description="what the text is: both streams (combined) or one")
    offset: int = Field(description="byte offset this text starts at")
    next_offset: int = Field(description="pass as ?offset= next time")
    text: str = Field(description="UTF-8, invalid bytes replaced; never splits a character")
    complete: bool = Field(description="the attempt is over and the end of its log was reached")


def char_start(path: Path | None, offset: int) -> int:
    """``offset`` moved past UTF-8 continuation bytes (at most 3) onto a character's start."""
    f = open_regular(path) if path is not None and offset else None
    if f is None:
        return offset
    try:
        with f:
            if offset >= os.fstat(f.fileno()).st_size:
                return offset  # nothing there (and seeking far past the end can fail)
            f.seek(offset)
            head = f.read(3)
    except OSError:
        return offset
    skip = 0
    while skip < len(head) and head[skip] & 0xC0 == 0x80:
        skip += 1
    return offset + skip


def read_chunk(path: Path | None, offset: int, limit: int, final: bool) -> tuple[str, int, bool]:
    """``(text, next_offset, at_end)`` from ``offset``. A multi-byte character cut at the end of
    the chunk is left for the next read (unless ``final``: the file will not grow)."""
    f = open_regular(path) if path is not None else None
    if f is None:  # none yet, or not a regular file (a job's FIFO would block this thread)
        return "", offset, True
    with f:
        # Past the end there is nothing to read; seeking there can fail (EINVAL past the
        # filesystem's largest file), so do not.
        if offset >= os.fstat(f.fileno()).st_size:
            return "", offset, True
        f.seek(offset)
        data = f.read(limit + 1)
    at_end = len(data) <= limit
    data = data[:limit]
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    text = decoder.decode(data, final=final and at_end)
    pending = len(decoder.getstate()[0])
    return text, offset + len(data) - pending, at_end and pending == 0


# node is left out while unknown (always, on the local executor: the chunk is as it was before
# executors had nodes); LogChunk has no other optional field.
@router.get(
    "/{job_id}/logs",
    response_model=LogChunk,
    response_model_exclude_none=True,
    responses={404: {**ERROR_RESPONSES[404], "description": "no such job, rank or attempt"}},
)
def read_logs(
    job: JobDep,
    request: Request,
    rank: Annotated[int, Query(ge=0, le=65_535)] = 0,
    attempt: Annotated[int | None, Query(ge=1, le=10_000, description="default: latest")] = None,
    offset: Annotated[
        int, Query(ge=0, le=LOG_OFFSET_MAX, description="byte offset; past the end: empty text")
    ] = 0,
    limit: Annotated[int, Query(ge=1, le=LOG_PAGE_MAX)] = LOG_PAGE_DEFAULT,
    stream: Annotated[
        LogStream, Query(description="combined: stdout and stderr in the order written")
    ] = LogStream.combined,
    tail: Annotated[
        int | None,
        Query(ge=1, le=LOG_PAGE_MAX,
              description="start this many bytes before the end (offset is then ignored)"),
    ] = None,
) -> LogChunk:
    job_id = job.id
    world = spec_world_size(job.spec)
    if rank >= world:
        raise ApiError(404, "not_found", f"job {job_id} has ranks 0..{world - 1}; no rank {rank}")
    # The state is read before the file: a terminal job's log does not grow any more.
    terminal = JobState(job.state) in TERMINAL_STATES
    attempts = {a["number"]: a for a in job.attempts or []}
    latest = max(attempts, default=1)
    attempt = attempt or latest
    if attempt > latest:
        raise ApiError(404, "not_found", f"job {job_id} has attempts 1..{latest}; no attempt {attempt}")
    over = terminal or attempts.get(attempt, {}).get("ended_at") is not None
    run = RunDir.for_job(request.app.state.settings.runs_dir, job_id)
    executor: Executor = request.app.state.executor
    where = executor.rank_log(run, attempt, rank, stream.value)
    if where.path is None and stream is LogStream.combined and over:
        stream = LogStream.stderr  # launched before combined files: the stream that explains
        where = executor.rank_log(run, attempt, rank, stream.value)
    path = where.path
    if tail is not None:
        offset = max(0, _size(path) - tail)
        limit = max(limit, tail)
    offset = char_start(path, offset)
    text, next_offset, at_end = read_chunk(path, offset, limit, final=over)
    return LogChunk(
        rank=rank, attempt=attempt, node=where.node, stream=stream, offset=offset,
        next_offset=next_offset, text=text, complete=over and at_end,
    )


def _size(path: Path | None) -> int:
    """The log's size, read as its text is (``open_regular``: never through a job's link)."""
    f = open_regular(path) if path is not None else None
    if f is None:
        return 0
    with f:
        return os.fstat(f.fileno()).st_size
