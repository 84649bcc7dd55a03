"""Unpacking an uploaded archive (zip or tar.gz) that may be hostile, into a fresh directory.

Contract: :func:`unpack` ``(archive, dest, limits) -> (files, unpacked_bytes)`` writes the
archive's regular files and directories under ``dest`` (which must not exist yet) and nothing
anywhere else, or raises :class:`ArchiveRefused` (a ``ValueError`` naming the member and the
rule) having written at most a partial tree under ``dest``, which the caller removes.

Refused: a name that is absolute, has a ``..`` segment, a NUL, or is not valid UTF-8 (a zip name
must be UTF-8, flagged or not); symlinks and hardlinks (nothing in a package may point anywhere);
device files, FIFOs and any other special member; two members of the same name; more than
``max_files`` members; more than ``max_unpacked_bytes`` in all, counted on the bytes actually
inflated (a zip bomb or a lying header is stopped while it inflates, not after); a member no
single read may hold (a tar pax header larger than :data:`READ_MAX_BYTES`). Files are created
with ``O_EXCL | O_NOFOLLOW``, mode 0644 (0755 when the archive marks them executable).
"""

import gzip
import os
import stat
import tarfile
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, BinaryIO

CHUNK_BYTES = 1024 * 1024
READ_MAX_BYTES = 64 * 1024 * 1024  # no single read of the inflated stream is larger
ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")
GZIP_MAGIC = b"\x1f\x8b"
ZIP_UTF8_FLAG = 0x800


class ArchiveRefused(ValueError):
    """A hostile or unusable archive; the message names the member and the rule."""


@dataclass(frozen=True)
class Limits:
    max_files: int
    max_unpacked_bytes: int


def archive_kind(head: bytes) -> str | None:
    """``zip``, ``tar.gz`` or None, from the first bytes."""
    if head.startswith(ZIP_MAGIC):
        return "zip"
    if head.startswith(GZIP_MAGIC):
        return "tar.gz"
    return None


def unpack(archive: Path, dest: Path, limits: Limits) -> tuple[int, int]:
    """Unpack ``archive`` into ``dest`` (created here); returns (files, unpacked bytes)."""
    with archive.open("rb") as f:
        kind = archive_kind(f.read(4))
    if kind is None:
        raise ArchiveRefused("body: not a zip or tar.gz archive")
    dest.mkdir()
    writer = _Writer(dest, limits)
    if kind == "zip":
        _unzip(archive, writer)
    else:
        _untar(archive, writer)
    return writer.files, writer.total


class _Writer:
    """Checks every name and counts files and bytes across the whole archive."""

    def __init__(self, dest: Path, limits: Limits) -> None:
        self.dest, self.limits = dest, limits
        self.seen: set[str] = set()
        self.files = self.total = 0

    def name(self, raw: str) -> PurePosixPath:
        if "\x00" in raw:
            raise ArchiveRefused(f"{raw[:200]!r}: a name must not contain NUL")
        try:
            raw.encode("utf-8")  # surrogates: bytes that were not UTF-8
        except UnicodeEncodeError:
            raise ArchiveRefused(f"{raw[:200]!r}: a name must be valid UTF-8") from None
        path = PurePosixPath(raw)
        if raw.startswith("/") or path.is_absolute():
            raise ArchiveRefused(f"{raw[:200]!r}: absolute paths are not allowed")
        if ".." in path.parts:
            raise ArchiveRefused(f"{raw[:200]!r}: '..' is not allowed in a name")
        parts = [p for p in path.parts if p != "."]
        if not parts:
            raise ArchiveRefused(f"{raw[:200]!r}: an empty name")
        clean = PurePosixPath(*parts)
        key = str(clean)
        if key in self.seen:
            raise ArchiveRefused(f"{key[:200]!r}: appears twice in the archive")
        self.seen.add(key)
        self.files += 1
        if self.files > self.limits.max_files:
            raise ArchiveRefused(
                f"more than {self.limits.max_files} members (TORCHYARD_PACKAGE_MAX_FILES)")
        return clean

    def directory(self, name: PurePosixPath) -> None:
        self._mkdirs(name)

    def file(self, name: PurePosixPath, source: IO[bytes], executable: bool) -> None:
        self._mkdirs(name.parent)
        target = self.dest.joinpath(*name.parts)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
        try:
            fd = os.open(target, flags, 0o755 if executable else 0o644)
        except OSError as exc:
            raise ArchiveRefused(f"{str(name)[:200]!r}: cannot be written ({exc.strerror})") from None
        with os.fdopen(fd, "wb") as out:
            while chunk := source.read(CHUNK_BYTES):
                self.total += len(chunk)
                if self.total > self.limits.max_unpacked_bytes:
                    raise ArchiveRefused(
                        f"{str(name)[:200]!r}: unpacks to more than "
                        f"{self.limits.max_unpacked_bytes} bytes "
                        "(TORCHYARD_PACKAGE_MAX_UNPACKED_BYTES)")
                out.write(chunk)

    def _mkdirs(self, name: PurePosixPath) -> None:
        current = self.dest
        for part in name.parts:
            current = current / part
            try:
                current.mkdir(mode=0o755)
            except FileExistsError:
                if current.is_symlink() or not current.is_dir():
                    raise ArchiveRefused(
                        f"{str(name)[:200]!r}: a file and a directory of the same name"
                    ) from None


def _unzip(archive: Path, writer: _Writer) -> None:
    try:
        zf = zipfile.ZipFile(archive)
    except UnicodeDecodeError:
        raise ArchiveRefused("a name flagged UTF-8 is not valid UTF-8") from None
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        raise ArchiveRefused(f"body: not a readable zip archive ({exc})") from None
    with zf:
        infos = zf.infolist()
        if len(infos) > writer.limits.max_files:
            raise ArchiveRefused(
                f"more than {writer.limits.max_files} members (TORCHYARD_PACKAGE_MAX_FILES)")
        for info in infos:
            raw = info.filename
            if not info.flag_bits & ZIP_UTF8_FLAG:  # cp437 as read; the bytes must be UTF-8
                try:
                    raw = raw.encode("cp437").decode("utf-8")
                except (UnicodeEncodeError, UnicodeDecodeError):
                    raise ArchiveRefused(f"{raw[:200]!r}: a name must be valid UTF-8") from None
            mode = info.external_attr >> 16
            kind = stat.S_IFMT(mode)
            if kind == stat.S_IFLNK:
                raise ArchiveRefused(f"{raw[:200]!r}: symlinks are not allowed in a package")
            if kind not in (0, stat.S_IFREG, stat.S_IFDIR):
                raise ArchiveRefused(
                    f"{raw[:200]!r}: only regular files and directories are allowed")
            name = writer.name(raw)
            if info.is_dir() or kind == stat.S_IFDIR:
                writer.directory(name)
                continue
            try:
                with zf.open(info) as source:
                    writer.file(name, source, bool(mode & 0o100))
            except (zipfile.BadZipFile, zlib.error, NotImplementedError, EOFError) as exc:
                raise ArchiveRefused(f"{raw[:200]!r}: cannot be read ({exc})") from None


class _BoundedReader:
    """The inflated tar stream, refusing any single read too large to hold in memory (tarfile
    reads a pax header in one call); members are read in order, so it only seeks forward."""

    def __init__(self, raw: BinaryIO) -> None:
        self.raw = raw

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0 or size > READ_MAX_BYTES:
            raise ArchiveRefused(f"a tar header or member needs a read over {READ_MAX_BYTES} bytes")
        return self.raw.read(size)

    def __getattr__(self, name: str) -> object:  # seek, tell
        return getattr(self.raw, name)


def _untar(archive: Path, writer: _Writer) -> None:
    with gzip.open(archive, "rb") as inflated:
        try:
            # Members in order; names as UTF-8, bad bytes as surrogates (refused by writer.name).
            tar = tarfile.open(
                fileobj=_BoundedReader(inflated),  # type: ignore[arg-type]
                mode="r:", encoding="utf-8", errors="surrogateescape",
            )
            with tar:
                for member in tar:
                    _tar_member(tar, member, writer)
        except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
            raise ArchiveRefused(f"body: not a readable tar.gz archive ({exc})") from None


def _tar_member(tar: tarfile.TarFile, member: tarfile.TarInfo, writer: _Writer) -> None:
    raw = member.name
    if member.issym() or member.islnk():
        raise ArchiveRefused(f"{raw[:200]!r}: symlinks and hardlinks are not allowed in a package")
    if not (member.isfile() or member.isdir()):
        raise ArchiveRefused(f"{raw[:200]!r}: only regular files and directories are allowed")
    name = writer.name(raw)
    if member.isdir():
        writer.directory(name)
        return
    source = tar.extractfile(member)
    if source is None:
        raise ArchiveRefused(f"{raw[:200]!r}: cannot be read")
    writer.file(name, source, bool(member.mode & 0o100))
