"""Removing a directory tree that a job or an upload made: any depth, never through a link.

Contract: :func:`remove_tree` ``(path) -> None`` removes ``path`` and everything under it.
``path`` missing (or anything under it vanishing meanwhile) is not an error; a symlink or a
file at ``path`` is itself removed, never followed. The walk is iterative and bottom-up and
holds one directory descriptor at a time, so neither Python's recursion limit nor the open-file
limit bounds the depth (``shutil.rmtree`` raises ``RecursionError`` near 1,000 levels, which
``ignore_errors=True`` does not catch), and no path it opens is longer than one name (a tree
deeper than ``PATH_MAX`` is removed too). It removes everything it can, then raises the first
``OSError`` it met when something is left (callers that must go on catch it and log); it never
raises anything else for what is on disk.

Climbing back up goes through ``..`` of the directory just emptied, checked against the
device and inode recorded on the way down: a tree moved under the walk stops it (``OSError``)
rather than letting it remove anything outside ``path``.
"""

import errno
import os
import stat
from dataclasses import dataclass, field

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_OWNER_RWX = stat.S_IRWXU


@dataclass
class _Level:
    """A directory being emptied: its name in its parent, the parent's identity, and the
    subdirectories still to visit (its other entries are already gone)."""

    name: str
    parent: tuple[int, int]
    subdirs: list[str] = field(default_factory=list)


def remove_tree(path: str | os.PathLike[str]) -> None:
    """Remove ``path`` and all below it (see the module docstring)."""
    root = os.fspath(path)
    try:
        top = os.lstat(root)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(top.st_mode):
        _unlink_missing_ok(root)
        return
    try:
        fd = os.open(root, _DIR_FLAGS)
    except FileNotFoundError:
        return
    errors: list[OSError] = []
    try:
        here = os.fstat(fd)
        if (here.st_dev, here.st_ino) != (top.st_dev, top.st_ino):
            raise OSError(f"{root}: replaced while being removed")
        levels = [_Level(name="", parent=(0, 0), subdirs=_clear(fd, errors))]
        while levels:
            level = levels[-1]
            if level.subdirs:
                child = _open_child(fd, level.subdirs.pop(), errors)
                if child is None:
                    continue
                name, child_fd = child
                identity = (here.st_dev, here.st_ino)
                os.close(fd)
                fd, here = child_fd, os.fstat(child_fd)
                levels.append(_Level(name=name, parent=identity, subdirs=_clear(fd, errors)))
                continue
            levels.pop()
            if not levels:
                break
            up = os.open("..", _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd, here = up, os.fstat(up)
            if (here.st_dev, here.st_ino) != level.parent:
                raise OSError(f"{root}: moved while being removed")
            try:
                os.rmdir(level.name, dir_fd=fd)
            except FileNotFoundError:
                pass
            except OSError as exc:
                errors.append(exc)
    finally:
        os.close(fd)
    try:
        os.rmdir(root)
    except FileNotFoundError:
        pass
    except OSError as exc:
        errors.append(exc)
    if errors:
        raise errors[0]


def _clear(fd: int, errors: list[OSError]) -> list[str]:
    """Remove every entry of the open directory ``fd`` but its subdirectories; their names."""
    try:
        mode = os.fstat(fd).st_mode
        if mode & _OWNER_RWX != _OWNER_RWX:  # a job may leave a directory it cannot write
            os.fchmod(fd, stat.S_IMODE(mode) | _OWNER_RWX)
    except OSError:
        pass  # not ours to change: the unlinks below say what is left
    subdirs = []
    try:
        with os.scandir(fd) as entries:
            names = [(e.name, e.is_dir(follow_symlinks=False)) for e in entries]
    except OSError as exc:
        errors.append(exc)
        return []
    for name, is_dir in names:
        if is_dir:
            subdirs.append(name)
            continue
        try:
            os.unlink(name, dir_fd=fd)
        except FileNotFoundError:
            pass
        except IsADirectoryError:  # became a directory since it was listed
            subdirs.append(name)
        except OSError as exc:
            errors.append(exc)
    return subdirs


def _open_child(fd: int, name: str, errors: list[OSError]) -> tuple[str, int] | None:
    try:
        return name, os.open(name, _DIR_FLAGS, dir_fd=fd)
    except FileNotFoundError:
        return None
    except NotADirectoryError:  # swapped for a file since it was listed
        pass
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            errors.append(exc)
            return None
    try:  # ELOOP: a symlink now; either way it goes as itself, never followed
        os.unlink(name, dir_fd=fd)
    except FileNotFoundError:
        pass
    except OSError as exc:
        errors.append(exc)
    return None


def _unlink_missing_ok(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


__all__ = ["remove_tree"]
