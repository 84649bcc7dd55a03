"""Reading files a job can write: regular files only, never more than a bound, never blocking,
never through a link the job planted.

A job's processes share its run directory, so any file there may be a FIFO (``open`` would block
the reader forever), a symlink to something else, a directory, or gigabytes long. Everything the
server or the attempt loop reads from a run directory goes through here: a file that is not a regular
file or is larger than asked for is refused (``None``), never waited on or read whole.

Confined (:func:`open_parent`): a path is opened one component at a time from ``/`` (``openat``),
each directory with ``O_NOFOLLOW``. A symlink is followed only where it sits in a *trusted*
directory — owned by root or by this process's user and writable by no one else — so the links
of the host's own layout (``/var/run``, a home on another disk) still work, while one a job
planted in its run directory, or in any directory it can write, is refused wherever it is on the
path; the last component is never followed. A run directory that belongs to a job's own Unix
user (docs/security.md, "Run as the team's Unix user") is not trusted, so a file read from it
must also be owned by that user (:func:`foreign`): a hard link it made to a file of root's or
another user's is refused, as are files of anyone else left there.
"""

import errno
import json
import os
import stat
from pathlib import Path
from typing import BinaryIO

TAIL_READ_BYTES = 64 * 1024  # how much of a log's end a tail reads
MAX_SYMLINKS = 40  # as the kernel's own path walk
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# The walk looks directories up without reading them (O_PATH), as the kernel's own path walk
# does: a directory the reader may pass through but not list (a home of mode 0711 above a
# run-as job's run directory, read by the job's attempt loop) is no obstacle.
_WALK_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def trusted(dir_st: os.stat_result) -> bool:
    """A directory only root or this user can change: what is in it was put there by one of them."""
    return dir_st.st_uid in (0, os.geteuid()) and not dir_st.st_mode & 0o022


def foreign(st: os.stat_result, dir_st: os.stat_result) -> bool:
    """A file in an untrusted directory that is not its owner's: a hard link to another user's
    file, or something its owner may not have meant for us."""
    return not trusted(dir_st) and st.st_uid != dir_st.st_uid


def open_parent(path: Path | str) -> tuple[int, str] | None:
    """An open descriptor of the directory holding ``path``'s last component, reached without
    following a symlink outside trusted directories, and that component's name (``..``, ``.``
    and an empty name are refused); None when there is no such directory. The descriptor is for
    lookups relative to it (``O_PATH``: ``openat``, ``mkdirat``, ``renameat``, ``fstat``), not for
    listing it. The caller closes it."""
    text = os.fspath(path)
    todo = [c for c in text.split("/") if c not in ("", ".")]
    if not todo or todo[-1] == "..":
        return None
    leaf = todo.pop()
    try:
        fd = os.open("/" if text.startswith("/") else ".", _WALK_FLAGS)
    except OSError:
        return None
    hops = 0
    try:
        while todo:
            name = todo.pop(0)
            try:
                nxt = os.open(name, _WALK_FLAGS, dir_fd=fd)
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR) or not trusted(os.fstat(fd)):
                    raise
                target = os.readlink(name, dir_fd=fd)  # OSError when it is no symlink at all
                hops += 1
                if hops > MAX_SYMLINKS:
                    raise
                todo[:0] = [c for c in target.split("/") if c not in ("", ".")]
                if target.startswith("/"):
                    nxt = os.open("/", _WALK_FLAGS)
                else:
                    continue
            os.close(fd)
            fd = nxt
    except OSError:
        os.close(fd)
        return None
    return fd, leaf


def open_dir(path: Path | str) -> int | None:
    """``path`` itself opened as a directory, confined as :func:`open_parent`; None if it is not
    one (a symlink in an untrusted directory included)."""
    found = open_parent(path)
    if found is None:
        return None
    dir_fd, leaf = found
    try:
        return os.open(leaf, _DIR_FLAGS, dir_fd=dir_fd)
    except OSError:
        return None
    finally:
        os.close(dir_fd)


def _open_regular(path: Path) -> int | None:
    """A read-only descriptor of ``path`` if it is a regular file reached as :func:`open_parent`
    says, not itself a symlink, and not :func:`foreign`."""
    found = open_parent(path)
    if found is None:
        return None
    dir_fd, leaf = found
    try:
        fd = os.open(leaf, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC,
                     dir_fd=dir_fd)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode) and not foreign(st, os.fstat(dir_fd)):
            return fd
    except OSError:
        pass
    finally:
        os.close(dir_fd)
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


def read_json_object(path: Path, max_bytes: int) -> dict | None:
    """The file as a JSON object (``read_bytes``'s rules), or None when it is not one: a file a
    job can write is untrusted, and a malformed one reads as absent, never as an error."""
    raw = read_bytes(path, max_bytes)
    if raw is None:
        return None
    try:
        data = json.loads(raw)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


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
    """True for a regular file :func:`open_regular` would open (a symlink, FIFO or directory is
    not)."""
    fd = _open_regular(path)
    if fd is None:
        return False
    os.close(fd)
    return True
