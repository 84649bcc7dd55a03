"""Unpacking an uploaded archive (zip or tar.gz) that may be hostile, into a fresh directory.

Contract: :func:`unpack` ``(archive, dest, limits) -> (files, unpacked_bytes)`` writes the
archive's regular files and directories under ``dest`` (which must not exist yet) and nothing
anywhere else, or raises :class:`ArchiveRefused` (a ``ValueError`` naming the member, by its
path inside the archive only, and the rule) or :class:`DiskFull` (free space fell below the
floor, or the disk filled, while it inflated), having written at most a partial tree under
``dest``, which the caller removes. Nothing else escapes: whatever a hostile member makes the
standard library raise (a codec's error, ``RecursionError``, an ``OSError`` of any kind) is
one of those two.

Refused: a name that is absolute, has a ``..`` segment, a NUL, or is not valid UTF-8 (a zip name
must be UTF-8, flagged or not); a name deeper than ``max_depth`` components, with a component
over 255 bytes or longer than 1024 bytes in all; symlinks and hardlinks (nothing in a package
may point anywhere); device files, FIFOs and any other special member; two members of the same
name; more than ``max_files`` members; more than ``max_unpacked_bytes`` in all, or inflating more
than ``max_ratio`` times the compressed bytes (per zip member, and per archive), counted on the
bytes actually inflated (a zip bomb or a lying header is stopped while it inflates, not after);
an encrypted zip member; a zip member compressed other than stored or deflate (``zipfile``
decompresses a bzip2 or lzma member's input without bounding its output: 753 bytes of bzip2
inflate to 1 GiB in one call, in memory); a member no single read may hold (a tar pax header
larger than :data:`READ_MAX_BYTES`). Files are created with ``O_EXCL | O_NOFOLLOW``, mode 0644
(0755 when the archive marks them executable). The rules on names and bounds are
:class:`service.domain.files.treewriter.TreeWriter`'s.
"""

import gzip
import stat
import tarfile
import zipfile
from pathlib import Path
from typing import BinaryIO

from service.domain.files.diskspace import DiskFull
from service.domain.files.treewriter import ArchiveRefused, Limits, TreeWriter, reason, shown

READ_MAX_BYTES = 64 * 1024 * 1024  # no single read of the inflated stream is larger
ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")
GZIP_MAGIC = b"\x1f\x8b"
ZIP_ENCRYPTED_FLAG = 0x1
ZIP_UTF8_FLAG = 0x800
ZIP_METHODS = {zipfile.ZIP_STORED: "stored", zipfile.ZIP_DEFLATED: "deflate"}
ZIP_REFUSED_METHODS = {zipfile.ZIP_BZIP2: "bzip2", zipfile.ZIP_LZMA: "lzma", 9: "deflate64"}


def archive_kind(head: bytes) -> str | None:
    """``zip``, ``tar.gz`` or None, from the first bytes."""
    if head.startswith(ZIP_MAGIC):
        return "zip"
    if head.startswith(GZIP_MAGIC):
        return "tar.gz"
    return None


def unpack(archive: Path, dest: Path, limits: Limits) -> tuple[int, int]:
    """Unpack ``archive`` into ``dest`` (created here); returns (files, unpacked bytes)."""
    try:
        with archive.open("rb") as f:
            kind = archive_kind(f.read(4))
        if kind is None:
            raise ArchiveRefused("body: not a zip or tar.gz archive")
        dest.mkdir()
    except OSError as exc:
        if isinstance(exc, DiskFull):
            raise
        raise ArchiveRefused(f"body: cannot be unpacked ({reason(exc)})") from None
    if kind == "zip":
        size = archive.stat().st_size
        writer = TreeWriter(dest, limits, compressed=lambda: size)
        _unzip(archive, writer)
    else:
        writer = _untar(archive, dest, limits)
    return writer.files, writer.total


def _unzip(archive: Path, writer: TreeWriter) -> None:
    try:
        zf = zipfile.ZipFile(archive)
    except UnicodeDecodeError:
        raise ArchiveRefused("a name flagged UTF-8 is not valid UTF-8") from None
    except Exception as exc:  # BadZipFile, or whatever a hostile directory makes zipfile raise
        raise ArchiveRefused(f"body: not a readable zip archive ({reason(exc)})") from None
    with zf:
        infos = zf.infolist()
        if len(infos) > writer.limits.max_files:
            raise ArchiveRefused(
                f"more than {writer.limits.max_files} members (TORCHYARD_PACKAGE_MAX_FILES)")
        for info in infos:
            raw = _zip_name(info)
            try:
                _zip_member(zf, info, raw, writer)
            except (ArchiveRefused, DiskFull):
                raise
            except Exception as exc:
                raise ArchiveRefused(f"{shown(raw)}: cannot be unpacked ({reason(exc)})") from None


def _zip_name(info: zipfile.ZipInfo) -> str:
    raw = info.filename
    if not info.flag_bits & ZIP_UTF8_FLAG:  # cp437 as read; the bytes must be UTF-8
        try:
            raw = raw.encode("cp437").decode("utf-8")
        except (UnicodeEncodeError, UnicodeDecodeError):
            raise ArchiveRefused(f"{shown(raw)}: a name must be valid UTF-8") from None
    return raw


def _zip_member(zf: zipfile.ZipFile, info: zipfile.ZipInfo, raw: str, writer: TreeWriter) -> None:
    mode = info.external_attr >> 16
    kind = stat.S_IFMT(mode)
    if kind == stat.S_IFLNK:
        raise ArchiveRefused(f"{shown(raw)}: symlinks are not allowed in a package")
    if kind not in (0, stat.S_IFREG, stat.S_IFDIR):
        raise ArchiveRefused(f"{shown(raw)}: only regular files and directories are allowed")
    name = writer.name(raw)
    if info.is_dir() or kind == stat.S_IFDIR:
        writer.directory(name)
        return
    if info.flag_bits & ZIP_ENCRYPTED_FLAG:
        raise ArchiveRefused(f"{shown(raw)}: encrypted members are not supported")
    if info.compress_type not in ZIP_METHODS:
        method = ZIP_REFUSED_METHODS.get(info.compress_type, f"method {info.compress_type}")
        raise ArchiveRefused(
            f"{shown(raw)}: {method} compression is not supported (only "
            f"{' or '.join(ZIP_METHODS.values())}, as zip tools write by default)")
    try:
        source = zf.open(info)
    except Exception as exc:
        raise ArchiveRefused(f"{shown(raw)}: cannot be read ({reason(exc)})") from None
    with source:
        writer.file(name, source, bool(mode & 0o100), compressed_size=info.compress_size)


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


def _untar(archive: Path, dest: Path, limits: Limits) -> TreeWriter:
    """A tar.gz is one compressed stream: its ratio is the bytes inflated against the
    compressed bytes read so far, checked as it inflates."""
    last = None  # the last member unpacked: a header that cannot be read comes after it
    try:
        with archive.open("rb") as compressed, gzip.GzipFile(fileobj=compressed) as inflated:
            writer = TreeWriter(dest, limits, compressed=compressed.tell)
            # Members in order; names as UTF-8, bad bytes as surrogates (refused by writer.name).
            tar = tarfile.open(
                fileobj=_BoundedReader(inflated),  # type: ignore[arg-type]
                mode="r:", encoding="utf-8", errors="surrogateescape",
            )
            with tar:
                for member in tar:
                    try:
                        _tar_member(tar, member, writer)
                    except (ArchiveRefused, DiskFull):
                        raise
                    except Exception as exc:
                        raise ArchiveRefused(
                            f"{shown(member.name)}: cannot be unpacked ({reason(exc)})") from None
                    last = member.name
    except (ArchiveRefused, DiskFull):
        raise
    except Exception as exc:  # TarError, a gzip or zlib error, EOFError, any OSError: the body
        where = f"the member after {shown(last)}" if last is not None else "body"
        raise ArchiveRefused(f"{where}: not a readable tar.gz archive ({reason(exc)})") from None
    return writer


def _tar_member(tar: tarfile.TarFile, member: tarfile.TarInfo, writer: TreeWriter) -> None:
    raw = member.name
    if member.issym() or member.islnk():
        raise ArchiveRefused(f"{shown(raw)}: symlinks and hardlinks are not allowed in a package")
    if not (member.isfile() or member.isdir()):
        raise ArchiveRefused(f"{shown(raw)}: only regular files and directories are allowed")
    name = writer.name(raw)
    if member.isdir():
        writer.directory(name)
        return
    source = tar.extractfile(member)
    if source is None:
        raise ArchiveRefused(f"{shown(raw)}: cannot be read")
    writer.file(name, source, bool(member.mode & 0o100))


__all__ = ["ArchiveRefused", "DiskFull", "Limits", "archive_kind", "unpack"]
