"""Writing an archive's members into a fresh tree, within the bounds a package must keep.

Contract: a :class:`TreeWriter` takes the members of one archive in order (``name`` first, then
``directory`` or ``file``) and writes them under its ``dest`` and nowhere else. It raises
:class:`ArchiveRefused` (answered 422) naming the member, only ever the member's path inside the
archive (never a server path, never an ``OSError``'s file name), or
:class:`service.domain.files.diskspace.DiskFull` (answered 507) when free space under the home
falls below the floor while it inflates, or the disk fills. What it wrote so far stays for the
caller to remove.

Bounds (``Limits``): members, depth (components of a name), bytes per component
(:data:`MAX_COMPONENT_BYTES`, the filesystems' own limit) and per name (:data:`MAX_NAME_BYTES`,
so a name under the store or a job's run directory stays well inside ``PATH_MAX``), bytes
unpacked, and the compression ratio: bytes inflated against compressed bytes, per member where
the archive says what a member's compressed size is (zip) and for the archive as a whole, each
with :data:`RATIO_ALLOWANCE_BYTES` that any ratio may inflate to (a small file of spaces is not
a bomb). Every count is taken on the bytes actually inflated, so a lying header changes nothing.
"""

import errno
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, NoReturn

from service.domain.files.diskspace import DiskFull, free_bytes
from torchyard_contract.confinement import PathRefused, relative_parts

CHUNK_BYTES = 1024 * 1024
MAX_COMPONENT_BYTES = 255  # NAME_MAX of every filesystem the home may be on
MAX_NAME_BYTES = 1024
RATIO_ALLOWANCE_BYTES = 1024 * 1024  # a member or an archive may inflate this far at any ratio
FLOOR_CHECK_BYTES = 1024 * 1024  # free space is read again after this many bytes written
NAME_SHOWN_CHARS = 200
DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


class ArchiveRefused(ValueError):
    """A hostile or unusable archive; the message names the member and the rule."""


@dataclass(frozen=True)
class Limits:
    """What one archive may hold (settings ``TORCHYARD_PACKAGE_*``); ``free_floor_bytes`` is
    ``TORCHYARD_DISK_FREE_FLOOR_BYTES`` (0: no floor)."""

    max_files: int
    max_unpacked_bytes: int
    max_depth: int = 64
    max_ratio: int = 200
    free_floor_bytes: int = 0


def shown(name: str | PurePosixPath) -> str:
    """A member's name as a message quotes it (bounded, repr-escaped)."""
    return repr(str(name)[:NAME_SHOWN_CHARS])


def reason(exc: BaseException) -> str:
    """Why a read failed, in words that name no server path (an ``OSError``'s ``str`` carries
    its file name)."""
    if isinstance(exc, OSError):
        return exc.strerror or type(exc).__name__
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    text = str(exc)
    return text[:NAME_SHOWN_CHARS] if text else type(exc).__name__


class TreeWriter:
    """Checks every name and counts files, bytes and the ratio across one archive.

    ``compressed`` says how many compressed bytes the archive has consumed so far (a zip: its
    whole size, read once; a tar.gz: the gzip stream's position, as it inflates)."""

    def __init__(self, dest: Path, limits: Limits, compressed: Callable[[], int]) -> None:
        self.dest, self.limits, self.compressed = dest, limits, compressed
        self.seen: set[str] = set()
        self.files = self.total = 0
        self._floor_checked_at = 0

    def name(self, raw: str) -> PurePosixPath:
        """The member's name, checked and normalised; counts it as a member. A plain relative
        path (``torchyard_contract.confinement``: the untrusted trees' rule), valid UTF-8, within
        the package's bounds."""
        try:
            parts = relative_parts(raw)
        except PathRefused as exc:
            raise ArchiveRefused(f"{shown(raw)}: {exc.rule}") from None
        try:
            encoded = raw.encode("utf-8")  # surrogates: bytes that were not UTF-8
        except UnicodeEncodeError:
            raise ArchiveRefused(f"{shown(raw)}: a name must be valid UTF-8") from None
        if len(parts) > self.limits.max_depth:
            raise ArchiveRefused(
                f"{shown(raw)}: {len(parts)} levels deep, more than {self.limits.max_depth} "
                "(TORCHYARD_PACKAGE_MAX_DEPTH)")
        if any(len(p.encode("utf-8")) > MAX_COMPONENT_BYTES for p in parts):
            raise ArchiveRefused(
                f"{shown(raw)}: a file or directory name is longer than {MAX_COMPONENT_BYTES} "
                "bytes")
        if len(encoded) > MAX_NAME_BYTES:
            raise ArchiveRefused(f"{shown(raw)}: the path is longer than {MAX_NAME_BYTES} bytes")
        clean = PurePosixPath(*parts)
        key = str(clean)
        if key in self.seen:
            raise ArchiveRefused(f"{shown(key)}: appears twice in the archive")
        self.seen.add(key)
        self.files += 1
        if self.files > self.limits.max_files:
            raise ArchiveRefused(
                f"more than {self.limits.max_files} members (TORCHYARD_PACKAGE_MAX_FILES)")
        return clean

    def directory(self, name: PurePosixPath) -> None:
        self._mkdirs(name, name)

    def file(self, name: PurePosixPath, source: IO[bytes], executable: bool,
             compressed_size: int | None = None) -> None:
        """Write one member from ``source``; ``compressed_size``, where the archive states it,
        bounds this member's own ratio."""
        self._mkdirs(name.parent, name)
        target = self.dest.joinpath(*name.parts)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(target, flags, 0o755 if executable else 0o644)
        except OSError as exc:
            self._write_failed(name, exc)
        written = 0
        try:
            while True:
                try:
                    chunk = source.read(CHUNK_BYTES)
                except (ArchiveRefused, DiskFull):
                    raise
                except Exception as exc:  # any codec's error, on any hostile stream
                    raise ArchiveRefused(f"{shown(name)}: cannot be read ({reason(exc)})") from None
                if not chunk:
                    break
                written += len(chunk)
                self._count(name, len(chunk), written, compressed_size)
                self._write(fd, name, chunk)
        finally:
            os.close(fd)

    def _write(self, fd: int, name: PurePosixPath, chunk: bytes) -> None:
        """Write all of ``chunk`` unbuffered (no flush at close can fail after the checks),
        then read free space again when a MiB has gone by since the last look."""
        view = memoryview(chunk)
        try:
            while view:
                view = view[os.write(fd, view):]
        except OSError as exc:
            self._write_failed(name, exc)
        if self.total - self._floor_checked_at >= FLOOR_CHECK_BYTES:
            self._check_floor(name)

    def _count(self, name: PurePosixPath, n: int, written: int, compressed_size: int | None) -> None:
        limits = self.limits
        self.total += n
        if self.total > limits.max_unpacked_bytes:
            raise ArchiveRefused(
                f"{shown(name)}: unpacks to more than {limits.max_unpacked_bytes} bytes "
                "(TORCHYARD_PACKAGE_MAX_UNPACKED_BYTES)")
        if compressed_size is not None and written > max(
                RATIO_ALLOWANCE_BYTES, limits.max_ratio * compressed_size):
            raise ArchiveRefused(
                f"{shown(name)}: inflates to more than {limits.max_ratio} times its compressed "
                "size (TORCHYARD_PACKAGE_MAX_RATIO)")
        if self.total > max(RATIO_ALLOWANCE_BYTES, limits.max_ratio * self.compressed()):
            raise ArchiveRefused(
                f"{shown(name)}: the archive inflates to more than {limits.max_ratio} times its "
                "compressed size (TORCHYARD_PACKAGE_MAX_RATIO)")

    def _check_floor(self, name: PurePosixPath) -> None:
        self._floor_checked_at = self.total
        floor = self.limits.free_floor_bytes
        if floor and (free := free_bytes(self.dest)) < floor:
            raise DiskFull(
                f"{shown(name)}: while unpacking, free space under TORCHYARD_HOME fell to {free} "
                f"bytes, below the floor of {floor} (TORCHYARD_DISK_FREE_FLOOR_BYTES); nothing "
                "was stored")

    def _write_failed(self, name: PurePosixPath, exc: OSError) -> NoReturn:
        if exc.errno in DISK_FULL_ERRNOS:
            raise DiskFull(
                f"{shown(name)}: the disk under TORCHYARD_HOME is full ({exc.strerror}); nothing "
                "was stored") from None
        raise ArchiveRefused(f"{shown(name)}: cannot be written ({reason(exc)})") from None

    def _mkdirs(self, directory: PurePosixPath, member: PurePosixPath) -> None:
        current = self.dest
        for part in directory.parts:
            current = current / part
            try:
                current.mkdir(mode=0o755)
            except FileExistsError:
                if current.is_symlink() or not current.is_dir():
                    raise ArchiveRefused(
                        f"{shown(member)}: a file and a directory of the same name") from None
            except OSError as exc:
                self._write_failed(member, exc)
