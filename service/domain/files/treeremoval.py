"""Removing a directory tree that a job wrote: however deep, without following a symlink.

``shutil.rmtree`` recurses once per level (Python 3.11), so a job's 1,200 nested folders raise
``RecursionError``, which ``ignore_errors=True`` does not catch; ``os.fwalk`` recurses the same
way. :func:`remove_tree` walks with a stack in memory instead and holds one directory descriptor
at a time: it climbs back with ``..`` relative to the descriptor it holds and checks that it
arrived where it came from (device and inode), so a tree of any depth costs one descriptor and
a stack of names.
"""

import os
import stat
from dataclasses import dataclass, field

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass
class _Level:
    """A directory being emptied: its name in its parent, its identity, the subdirectories
    still to remove (its other entries are unlinked when it is first entered)."""

    name: str
    dev: int
    ino: int
    pending: list[str] = field(default_factory=list)


def remove_tree(path: str | os.PathLike[str]) -> None:
    """Remove ``path`` and everything under it, bottom-up, iteratively (no depth limit).

    A symlink (at the top or anywhere below) is removed itself, never followed; a file at the
    top is unlinked. A missing ``path``, or an entry that disappears meanwhile, is not an error.
    Any other failure (an entry the server's user may not remove, a tree moved while it is being
    removed) raises ``OSError`` with what could not be removed left in place: the caller decides
    whether to log it and go on.
    """
    top = os.fspath(path)
    try:
        st = os.lstat(top)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        _unlink(top, None)
        return
    try:
        fd = os.open(top, _DIR_FLAGS)
    except FileNotFoundError:
        return
    try:
        _empty(fd, top)
    finally:
        os.close(fd)
    try:
        os.rmdir(top)
    except FileNotFoundError:
        pass


def _empty(top_fd: int, top: str) -> None:
    """Empty the directory open as ``top_fd``; the descriptor this ends with is closed here,
    except ``top_fd`` itself (the caller's)."""
    top_st = os.fstat(top_fd)
    stack = [_Level("", top_st.st_dev, top_st.st_ino, _clear_files(top_fd))]
    fd = top_fd
    try:
        while stack:
            level = stack[-1]
            if level.pending:
                name = level.pending.pop()
                try:
                    child = os.open(name, _DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    continue
                child_st = os.fstat(child)
                if fd != top_fd:
                    os.close(fd)
                fd = child
                stack.append(_Level(name, child_st.st_dev, child_st.st_ino, _clear_files(fd)))
                continue
            stack.pop()
            if not stack:
                break
            parent = stack[-1]
            up = top_fd if len(stack) == 1 else os.open("..", _DIR_FLAGS, dir_fd=fd)
            up_st = os.fstat(up)
            if (up_st.st_dev, up_st.st_ino) != (parent.dev, parent.ino):
                if up != top_fd:
                    os.close(up)
                raise OSError(f"{top}: moved while it was being removed")
            if fd != top_fd:
                os.close(fd)
            fd = up
            try:
                os.rmdir(level.name, dir_fd=fd)
            except FileNotFoundError:
                pass
    finally:
        if fd != top_fd:
            os.close(fd)


def _clear_files(fd: int) -> list[str]:
    """Unlink every entry of the directory open as ``fd`` that is not a directory (symlinks
    included, unfollowed); the names of its subdirectories."""
    subdirs = []
    with os.scandir(fd) as entries:
        for entry in entries:
            try:
                is_dir = entry.is_dir(follow_symlinks=False)
            except FileNotFoundError:
                continue
            if is_dir:
                subdirs.append(entry.name)
            else:
                _unlink(entry.name, fd)
    return subdirs


def _unlink(name: str, dir_fd: int | None) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass
