"""Artifact routes: list what a job kept (``TORCHYARD_OUTPUT_DIR``, its checkpoints) and
download one, streamed, with ``ETag``, ``Range`` (206) and ``Content-Disposition``.

What may be served and how it is opened safely is ``service.domain.files.artifacts``; how a
page is listed at the cost of the page, ``service.domain.files.artifactlisting``.
"""

import os
import re
from collections.abc import Iterator
from typing import Annotated
from urllib.parse import quote

from fastapi import APIRouter, Header, Query
from fastapi.responses import Response, StreamingResponse

from service.api.deps import JobDep, SettingsDep
from service.api.errors import ERROR_RESPONSES, ApiError
from service.api.schemas import ArtifactList, ArtifactRead
from service.domain.files.artifactlisting import MAX_PATH_CHARS, list_artifacts
from service.domain.files.artifacts import ArtifactNotFound, job_uid, open_artifact
from torchyard_contract.rundir import RunDir

router = APIRouter(prefix="/jobs", tags=["artifacts"])
CHUNK_BYTES = 1024 * 1024
RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")
MULTIPLE_RANGES = re.compile(r"^bytes=[^,]*,")


@router.get("/{job_id}/artifacts", response_model=ArtifactList)
def get_artifacts(
    job: JobDep,
    settings: SettingsDep,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    after: Annotated[
        str | None,
        Query(max_length=MAX_PATH_CHARS, description="cursor: paths sorting after this one"),
    ] = None,
) -> ArtifactList:
    """Files the job kept, sorted by path: its output directory, and its checkpoints under
    ``checkpoints/``; only regular files with one link, of the job's own user. Pass
    ``next_after`` as ``?after=`` for the next page: a page examines a bounded number of
    entries, so it may hold fewer than ``limit`` items before the listing ends."""
    run = RunDir.for_job(settings.runs_dir, job.id)
    page = list_artifacts(run, after, limit, job_uid(run))
    return ArtifactList(
        job_id=job.id,
        items=[ArtifactRead(path=a.path, size=a.size, modified=a.modified) for a in page.items],
        next_after=page.next_after,
        skipped=page.skipped,
        examined=page.examined,
    )


@router.get(
    "/{job_id}/artifacts/{path:path}",
    response_class=StreamingResponse,
    responses={
        200: {"content": {"application/octet-stream": {"schema": {"type": "string",
                                                                  "format": "binary"}}},
              "description": "the file (also for a Range of several ranges: the whole file)"},
        206: {"content": {"application/octet-stream": {"schema": {"type": "string",
                                                                  "format": "binary"}}},
              "description": "the requested range (Range: bytes=START-END)"},
        304: {"description": "If-None-Match matched the ETag"},
        404: {**ERROR_RESPONSES[404], "description": "no such job, or no regular file at this "
              "path inside its outputs"},
        416: {**ERROR_RESPONSES[404], "description": "the range is outside the file"},
    },
)
def download_artifact(
    job: JobDep,
    path: str,
    settings: SettingsDep,
    range_: Annotated[str | None, Header(alias="range", max_length=200)] = None,
    if_none_match: Annotated[str | None, Header(max_length=1000)] = None,
    if_range: Annotated[str | None, Header(max_length=1000)] = None,
) -> Response:
    """Download one artifact, streamed, by its listed path. ``Range: bytes=START-END`` (one
    range) answers 206 with ``Content-Range``; several ranges, or ``If-Range`` with a stale
    ETag, answer the whole file (RFC 9110 lets a server ignore ``Range``)."""
    run = RunDir.for_job(settings.runs_dir, job.id)
    try:
        fd, st = open_artifact(run, path, job_uid(run))
    except ArtifactNotFound as exc:
        raise ApiError(404, "not_found", f"job {job.id}: {exc}") from exc
    os.close(fd)  # opened again, the same way, when the body is sent (a HEAD sends none)
    etag = f'"{st.st_ino:x}-{st.st_size:x}-{st.st_mtime_ns:x}"'
    name = path.rsplit("/", 1)[-1]
    headers = {
        "ETag": etag,
        "Accept-Ranges": "bytes",
        "Content-Disposition": _disposition(name),
    }
    if if_none_match is not None and etag in [t.strip() for t in if_none_match.split(",")]:
        return Response(status_code=304, headers={"ETag": etag})
    size = st.st_size
    start, end, status = 0, size - 1, 200
    if (range_ is not None and (if_range is None or if_range.strip() == etag)
            and not MULTIPLE_RANGES.match(range_.strip())):
        parsed = _range(range_, size)
        if parsed is None:
            raise ApiError(416, "range_not_satisfiable",
                           f"Range {range_!r} is not within the file's {size} bytes",
                           {"Content-Range": f"bytes */{size}"})
        start, end = parsed
        status = 206
        headers["Content-Range"] = f"bytes {start}-{end}/{size}"
    headers["Content-Length"] = str(max(0, end - start + 1))
    return StreamingResponse(_read(run, path, st, start, end - start + 1), status_code=status,
                             headers=headers, media_type="application/octet-stream")


def _range(header: str, size: int) -> tuple[int, int] | None:
    match = RANGE.match(header.strip())
    if match is None or not (match[1] or match[2]):
        return None
    if not match[1]:  # bytes=-N: the last N
        length = int(match[2])
        if length == 0 or size == 0:
            return None
        return max(0, size - length), size - 1
    start = int(match[1])
    end = int(match[2]) if match[2] else size - 1
    if start >= size or end < start:
        return None
    return start, min(end, size - 1)


def _read(run: RunDir, path: str, checked: os.stat_result, offset: int,
          length: int) -> Iterator[bytes]:
    """The bytes (on the thread pool), from the file opened safely again: the same file that
    was checked (device and inode), or nothing."""
    try:
        fd, st = open_artifact(run, path, job_uid(run))
    except ArtifactNotFound:  # gone or replaced since the headers: the body ends short
        return
    if (st.st_dev, st.st_ino) != (checked.st_dev, checked.st_ino):
        os.close(fd)
        return
    try:
        while length > 0:
            chunk = os.pread(fd, min(CHUNK_BYTES, length), offset)
            if not chunk:
                break
            offset += len(chunk)
            length -= len(chunk)
            yield chunk
    finally:
        os.close(fd)


def _disposition(name: str) -> str:
    ascii_name = re.sub(r'[^A-Za-z0-9._ -]', "_", name) or "artifact"
    return f"attachment; filename=\"{ascii_name}\"; filename*=UTF-8''{quote(name, safe='')}"
