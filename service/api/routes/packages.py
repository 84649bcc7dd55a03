"""Package routes: upload code (a zip or a tar.gz, streamed to disk) and ask whether it is here.

``POST /packages`` is the one route whose body is not JSON and not held in memory: the body
limit and the JSON check (``service.api.middleware``) let it through as a stream, and this route
enforces ``TORCHYARD_PACKAGE_MAX_UPLOAD_BYTES`` as the bytes arrive. The archive is checked and
unpacked by ``service.domain.files.unpack`` into ``service.domain.files.packages``.
"""

import hashlib
import pathlib
from typing import Annotated, BinaryIO

import anyio
from fastapi import APIRouter, Path, Request, Response
from starlette.requests import ClientDisconnect

from service.api.deps import CallerDep, SettingsDep, SupervisorDep, hidden
from service.api.errors import ERROR_RESPONSES, ApiError
from service.api.schemas import PackageRead
from service.domain.files.diskspace import DiskFull, check_floor
from service.domain.files.packages import DIGEST_PATTERN, package_store
from service.domain.files.unpack import ArchiveRefused
from service.settings import Settings

router = APIRouter(prefix="/packages", tags=["packages"])
UPLOAD_PATH = "/packages"  # streamed: exempt from the body limit and the JSON check
WRITE_CHUNK_BYTES = 1024 * 1024
ARCHIVE_BODY = {
    "required": True,
    # Any content type is taken (the archive's own bytes say zip or tar.gz); one is documented,
    # the one client generators understand.
    "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
}
Digest = Annotated[str, Path(pattern=DIGEST_PATTERN, description="'sha256:' and 64 hex digits")]


def _refuse_unless_enabled(settings: Settings) -> None:
    if not settings.packages_enabled:
        raise ApiError(403, "packages_disabled", "packages are turned off on this server "
                       "(TORCHYARD_PACKAGES_ENABLED=false)")
    if not settings.api_tokens_configured:
        raise ApiError(403, "forbidden", "packages are code and need API tokens; start the "
                       "server with TORCHYARD_API_TOKENS (or TORCHYARD_API_TOKENS_FILE) set")


def disk_floor(settings: Settings) -> None:
    """507 below the free-space floor (``service.domain.files.diskspace``)."""
    try:
        check_floor(settings)
    except DiskFull as exc:
        raise ApiError(507, "insufficient_storage", str(exc)) from exc


@router.post(
    "",
    status_code=201,
    response_model=PackageRead,
    openapi_extra={"requestBody": ARCHIVE_BODY},
    responses={
        200: {"model": PackageRead, "description": "the same content was already stored"},
        400: {**ERROR_RESPONSES[400], "description": "the upload was cut off"},
        403: {**ERROR_RESPONSES[403], "description": "packages are turned off, or the server "
              "has no API tokens"},
        413: {**ERROR_RESPONSES[413], "description": "larger than "
              "TORCHYARD_PACKAGE_MAX_UPLOAD_BYTES"},
        415: {**ERROR_RESPONSES[415], "description": "not a zip or tar.gz archive"},
        422: {**ERROR_RESPONSES[422], "description": "a hostile or unusable archive (absolute "
              "path, '..', link, device file or FIFO, duplicate name, name not UTF-8, deeper "
              "than TORCHYARD_PACKAGE_MAX_DEPTH, a name component over 255 bytes or a name "
              "over 1024, too many files, unpacks too large or beyond "
              "TORCHYARD_PACKAGE_MAX_RATIO, an encrypted or unreadable member, compression "
              "other than stored or deflate); the message names the member by its path in the "
              "archive"},
        507: {**ERROR_RESPONSES[422], "description": "free space under TORCHYARD_HOME is below "
              "TORCHYARD_DISK_FREE_FLOOR_BYTES, before the upload or while it unpacks"},
    },
)
async def upload_package(
    request: Request, response: Response, settings: SettingsDep, caller: CallerDep,
    supervisor: SupervisorDep,
) -> PackageRead:
    """Upload a zip or tar.gz as the body (any content type). Answers the package's digest
    (SHA-256 of the bytes), what it holds, and 201; the same bytes again from the same team
    answer 200. A package is its uploading team's: another team sees it (and its jobs name it)
    only once it uploads the same bytes itself; they are stored once. A job names it as
    ``"package": "sha256:<hex>"``."""
    _refuse_unless_enabled(settings)
    disk_floor(settings)
    limit = settings.package_max_upload_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, "payload_too_large", f"the archive is {declared} bytes, more than "
                       f"{limit} (TORCHYARD_PACKAGE_MAX_UPLOAD_BYTES)")
    store = package_store(settings)
    upload = await anyio.to_thread.run_sync(store.new_upload)
    try:
        hexdigest, size = await _receive(request, upload, limit)
        if declared is not None and declared.isdigit() and size != int(declared):
            raise ApiError(400, "invalid_request", f"the upload was cut off after {size} of "
                           f"{declared} bytes; nothing was stored")
        if size == 0:
            raise ApiError(415, "unsupported_media_type", "body: empty; send a zip or tar.gz")
        with upload.open("rb") as f:
            head = f.read(4)
        if not (head.startswith((b"PK\x03\x04", b"PK\x05\x06")) or head.startswith(b"\x1f\x8b")):
            raise ApiError(415, "unsupported_media_type", "body: not a zip or tar.gz archive")
        info, stored = await anyio.to_thread.run_sync(
            store.add, upload, f"sha256:{hexdigest}", size)
        # 201 when new to the caller's team (another team's copy is not told of).
        granted = await anyio.to_thread.run_sync(supervisor.grant_package, info.digest, caller)
        created = granted if caller.team is not None else stored
    except ArchiveRefused as exc:
        raise ApiError(422, "invalid_package", f"archive: {exc}") from exc
    except DiskFull as exc:  # the floor crossed, or the disk filled, while it inflated
        raise ApiError(507, "insufficient_storage", str(exc)) from exc
    finally:
        upload.unlink(missing_ok=True)
    if not created:
        response.status_code = 200
    response.headers["Location"] = f"/packages/{info.digest}"
    return PackageRead(digest=info.digest, size=info.size, files=info.files)


async def _receive(request: Request, upload: pathlib.Path, limit: int) -> tuple[str, int]:
    """Stream the body into ``upload``; (SHA-256 hex, size). 413 past ``limit``; 400 when the
    client goes away mid-body (the caller removes the file)."""
    sha = hashlib.sha256()
    size = 0
    pending: list[bytes] = []
    pending_bytes = 0

    def flush(f: BinaryIO, chunks: list[bytes]) -> None:
        data = b"".join(chunks)
        sha.update(data)
        f.write(data)

    with upload.open("wb") as f:
        try:
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise ApiError(413, "payload_too_large", f"the archive is more than {limit} "
                                   "bytes (TORCHYARD_PACKAGE_MAX_UPLOAD_BYTES)")
                pending.append(chunk)
                pending_bytes += len(chunk)
                if pending_bytes >= WRITE_CHUNK_BYTES:
                    chunks, pending, pending_bytes = pending, [], 0
                    await anyio.to_thread.run_sync(flush, f, chunks)
        except ClientDisconnect:
            raise ApiError(400, "invalid_request", "the upload was cut off; nothing was "
                           "stored") from None
        if pending:
            await anyio.to_thread.run_sync(flush, f, pending)
    return sha.hexdigest(), size


@router.get("/{digest}", response_model=PackageRead)
def get_package(
    digest: Digest, settings: SettingsDep, caller: CallerDep, supervisor: SupervisorDep,
    request: Request,
) -> PackageRead:
    """Whether the server holds this package for the caller's team (``HEAD`` answers the same
    without a body): a client uploads only what is missing. Another team's package is 404, as
    a missing one. A check counts as a use (garbage collection waits)."""
    missing = f"package {digest} is not on this server"
    if not supervisor.intake.package_visible(digest, caller):
        raise hidden(request, "package", missing)
    info = package_store(settings).get(digest)
    if info is None:
        raise ApiError(404, "not_found", missing)
    return PackageRead(digest=info.digest, size=info.size, files=info.files)
