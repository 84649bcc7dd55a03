"""Reading files a job can write: regular files only, never more than a bound, never blocking.

A job's processes share its run directory, so any file there may be a FIFO (``open`` would block
the reader forever), a symlink to something else, a directory, or gigabytes long. Everything the
server or the shim reads from a run directory goes through here: a file that is not a regular
file or is larger than asked for is refused (``None``), never waited on or read whole.
"""

import os
import stat
from pathlib import Path
from typing import BinaryIO

TAIL_READ_BYTES = 64 * 1024  # how much of a log's end a tail reads


def _open_regular(path: Path) -> int | None:
    """A read-only descriptor of ``path`` if it is a regular file (not through a symlink)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


def open_regular(path: Path) -> BinaryIO | None:
    """``path`` opened for binary reading if it is a regular file (not a FIFO, not a symlink)."""
    fd = _open_regular(path)
    return os.fdopen(fd, "rb") if fd is not None else None


def read_bytes(path: Path, max_bytes: int) -> bytes | None:
    """The whole file, or None when it is missing, not a regular file, or over ``max_bytes``."""
    fd = _open_regular(path)
    if fd is None:
        return None
    try:
        with os.fdopen(fd, "rb") as f:
            data = f.read(max_bytes + 1)
    except OSError:
        return None
    return data if len(data) <= max_bytes else None


def read_tail(path: Path, max_bytes: int = TAIL_READ_BYTES) -> str:
    """The last ``max_bytes`` of a regular file as text (invalid UTF-8 replaced); "" otherwise."""
    fd = _open_regular(path)
    if fd is None:
        return ""
    try:
        with os.fdopen(fd, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            f.seek(max(0, size - max_bytes))
            data = f.read(max_bytes)
    except OSError:
        return ""
    return data.decode("utf-8", errors="replace")


def is_regular(path: Path) -> bool:
    """True for a regular file (a symlink, FIFO or directory is not)."""
    try:
        return stat.S_ISREG(path.lstat().st_mode)
    except OSError:
        return False
