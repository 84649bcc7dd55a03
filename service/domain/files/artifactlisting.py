"""Listing a job's artifacts a page at a time, at the cost of the page, not of the job's files.

The listing is one sorted tree: the job's output directory, with ``RUN_DIR/checkpoints`` as its
top-level ``checkpoints/`` and the server's TensorBoard event files (``RUN_DIR/tensorboard``) as
its ``tensorboard/`` (the output directory's own entries of those names are not listed;
``service.domain.files.artifacts.reserved_roots``).
Paths are sorted as strings, names written as ``service.domain.files.artifactnames`` writes
them; ``after`` (the cursor) is any string, and a page holds the paths after it.

How a page is made: a depth-first walk that sorts each directory's names (a directory's name
sorts with a ``/`` after it, so the walk's order is the order of the paths), never opens a
directory whose paths all sort before the cursor, and stops once the page is full. Each
directory is opened relative to its parent's descriptor with ``O_NOFOLLOW`` (a symlink swapped
in for a directory lists nothing outside), one descriptor at a time: the walk climbs back with
``..`` and checks it arrived where it came from.

Bounds, per request (``docs/security.md``):

* Reading a directory's names is the one cost that follows a directory's size (names cannot be
  sorted without reading them all); a directory with more than
  :data:`LIST_MAX_DIRECTORY_ENTRIES` entries is not listed (it counts as skipped), and of the
  others only the :data:`LIST_MAX_EXAMINED` first names after the cursor are kept in memory.
* A page opens no further directory once it has read :data:`LIST_MAX_EXAMINED` names, and
  judges at most that many entries; it then ends with what it found and the cursor to go on
  (``next_after`` is then set while ``items`` may be fewer than ``limit``). The directories that
  lead to the cursor are always read, so every page moves the cursor on.
* What is not served (``service.domain.files.artifacts.served``: symlinks, FIFOs, hard links,
  another user's files) and a path longer than :data:`MAX_PATH_CHARS` (it could not be passed
  back as a cursor) are skipped and counted. Dot-files (files being written) are not listed.
"""

import heapq
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

from service.domain.files.artifactnames import listed_name
from service.domain.files.artifacts import job_uid, owner_under, reserved_roots, served
from torchyard_contract.rundir import RunDir

logger = logging.getLogger(__name__)

LIST_MAX_EXAMINED = 10_000  # names read past the cursor's way, and entries judged, per page
LIST_MAX_DIRECTORY_ENTRIES = 1_000_000  # a bigger directory is not listed
MAX_PATH_CHARS = 4096  # the cursor's bound (``?after=``): a longer path is not listed

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True)
class Artifact:
    path: str
    size: int
    modified: float


@dataclass(frozen=True)
class ArtifactPage:
    items: list[Artifact]
    next_after: str | None  # the cursor for the next page; None: the listing is done
    skipped: int  # entries this page passed over that are not served
    examined: int  # directory entries this page read


class _Entry(NamedTuple):  # a tuple: compared (and sorted) by its key, made fast
    key: str  # the listed name, with "/" after a directory's: keys sort as paths do
    name: str  # as os.scandir gave it
    is_dir: bool
    reserved: str = ""  # a reserved top-level name (checkpoints, tensorboard): its own directory


@dataclass
class _Level:
    prefix: str  # the directory's listed path with its "/" ("" at the top)
    ident: tuple[int, int]  # (st_dev, st_ino)
    entries: list[_Entry] = field(default_factory=list)  # descending: the next one is last
    truncated: bool = False  # more entries than were kept: the page ends where these do


class _TooLarge(Exception):
    pass


class _Moved(Exception):
    pass


def list_artifacts(run: RunDir, after: str | None, limit: int, owner_uid: int,
                   max_examined: int = LIST_MAX_EXAMINED) -> ArtifactPage:
    """One page of the job's artifacts after ``after`` (see the module docstring)."""
    return _Walk(run, after, limit, owner_uid, max_examined).page()


class _Walk:
    def __init__(self, run: RunDir, after: str | None, limit: int, owner_uid: int,
                 max_examined: int) -> None:
        self.run, self.after, self.limit = run, after, limit
        self.roots = reserved_roots(run)
        self.owner_uid, self.max_examined = owner_uid, max_examined
        self.items: list[Artifact] = []
        self.skipped = self.examined = self.judged = 0
        self.beyond_read = 0  # names read in directories past the cursor's way: the budget
        self.last = after  # the last path judged: where the next page starts

    def page(self) -> ArtifactPage:
        try:
            top_fd = os.open(self.run.output_dir, _DIR_FLAGS)
        except OSError:
            top_fd = None
        try:
            done = self._walk(top_fd)
        finally:
            if top_fd is not None:
                os.close(top_fd)
        next_after = None if done else self.last
        return ArtifactPage(self.items, next_after, self.skipped, self.examined)

    def _walk(self, top_fd: int | None) -> bool:
        """Fill the page; True when the listing ended, False when the page stopped early."""
        top = _Level("", (0, 0))
        if top_fd is not None:
            try:
                top.entries, top.truncated = self._read(top_fd, "", top=True)
            except _TooLarge:
                self.skipped += 1
        for name, directory in self.roots.items():
            key = f"{name}/"
            if (directory.is_dir() and self._after_cursor(key)
                    and not (top.truncated and key > top.entries[0].key)):  # a later page's
                top.entries.append(_Entry(key, name, True, name))
        top.entries.sort(reverse=True)
        stack, fd = [top], top_fd
        try:
            while stack:
                level = stack[-1]
                if not level.entries:
                    if level.truncated and self.judged:
                        return False  # the rest of this directory is the next page's
                    stack.pop()
                    if stack and fd != top_fd:
                        below, fd = fd, None
                        try:
                            fd = self._climb(below, stack[-1].ident) if len(stack) > 1 else top_fd
                        finally:
                            os.close(below)  # type: ignore[arg-type]
                    continue
                entry = level.entries[-1]
                path = level.prefix + entry.key
                beyond = self.after is None or path > self.after  # not on the cursor's way
                if beyond and self.judged and (self.judged >= self.max_examined or (
                        entry.is_dir and self.beyond_read >= self.max_examined)):
                    return False  # bounded: the next page goes on from self.last
                level.entries.pop()
                if beyond:
                    self.judged += 1
                    self.last = path
                if len(path) > MAX_PATH_CHARS:
                    self.skipped += 1
                elif entry.is_dir:
                    child = self._enter(fd, entry, path, beyond)
                    if child is not None:
                        if fd != top_fd:
                            os.close(fd)  # type: ignore[arg-type]
                        fd, level = child
                        stack.append(level)
                elif self._judge(fd, entry, path) and len(self.items) == self.limit:
                    return False
        except _Moved:
            logger.warning("%s: moved while it was listed; the page ends here", self.run.root)
            return not self.judged
        finally:
            if fd is not None and fd != top_fd:
                os.close(fd)
        return True

    def _after_cursor(self, path: str) -> bool:
        """Whether ``path`` (a directory's with its ``/``) holds anything after the cursor."""
        if self.after is None or path > self.after:
            return True
        return path.endswith("/") and self.after.startswith(path)

    def _read(self, fd: int, prefix: str, top: bool = False) -> tuple[list[_Entry], bool]:
        """The directory's first entries after the cursor, descending, and whether there are
        more: a page judges at most ``max_examined``, and one more may lead to the cursor."""
        keep = self.max_examined + 1
        kept = heapq.nsmallest(keep + 1, self._scan(fd, prefix, top))
        truncated = len(kept) > keep
        del kept[keep:]
        kept.reverse()
        return kept, truncated

    def _scan(self, fd: int, prefix: str, top: bool) -> Iterator[_Entry]:
        """The entries after the cursor (the loop every name of a big directory goes through)."""
        after, n = self.after, 0
        try:
            with os.scandir(fd) as names:
                for n, entry in enumerate(names, 1):
                    if n > LIST_MAX_DIRECTORY_ENTRIES:
                        raise _TooLarge
                    name = entry.name
                    try:
                        is_dir = entry.is_dir(follow_symlinks=False)
                    except OSError:
                        continue
                    key = name if name.isascii() and "%" not in name else listed_name(name)
                    if is_dir:
                        key += "/"
                        if after is None or prefix + key > after or after.startswith(
                                prefix + key):
                            if not (top and name in self.roots):  # RUN_DIR's own
                                yield _Entry(key, name, True)
                    elif (after is None or prefix + key > after) and not (
                            top and name in self.roots):
                        yield _Entry(key, name, False)
        finally:
            self.examined += n

    def _enter(self, fd: int | None, entry: _Entry, path: str,
               beyond: bool) -> tuple[int, _Level] | None:
        """Open and read a directory; None where it is gone, replaced or too large."""
        try:
            if entry.reserved:
                child = os.open(self.roots[entry.reserved], _DIR_FLAGS)
            else:
                child = os.open(entry.name, _DIR_FLAGS, dir_fd=fd)
        except FileNotFoundError:
            return None
        except OSError:  # a symlink or a file now
            self.skipped += 1
            return None
        read_before = self.examined
        try:
            st = os.fstat(child)
            level = _Level(path, (st.st_dev, st.st_ino), *self._read(child, path))
        except _TooLarge:
            os.close(child)
            self.skipped += 1
            return None
        except BaseException:
            os.close(child)
            raise
        finally:
            if beyond:
                self.beyond_read += self.examined - read_before
        return child, level

    def _climb(self, fd: int, ident: tuple[int, int]) -> int:
        """The parent of the directory open as ``fd``, which must be ``ident``."""
        up = os.open("..", _DIR_FLAGS, dir_fd=fd)
        st = os.fstat(up)
        if (st.st_dev, st.st_ino) != ident:
            os.close(up)
            raise _Moved
        return up

    def _judge(self, fd: int | None, entry: _Entry, path: str) -> bool:
        """Add the file to the page if it is served; whether it was."""
        if entry.name.startswith("."):
            return False  # being written (temp files): not listed, not counted
        try:
            st = os.stat(entry.name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            return False
        except OSError:
            self.skipped += 1
            return False
        if not served(st, owner_under(path.partition("/")[0], self.owner_uid)):
            self.skipped += 1
            return False
        self.items.append(Artifact(path, st.st_size, st.st_mtime))
        return True


def output_files(run: RunDir) -> Iterator[Artifact]:
    """Every served file of the output directory itself (not ``checkpoints/``, not the server's
    ``tensorboard/``), page by page: what ``log_outputs`` uploads to MLflow."""
    owner, after = job_uid(run), None
    reserved = tuple(f"{name}/" for name in reserved_roots(run))
    while True:
        page = list_artifacts(run, after, 1000, owner)
        yield from (item for item in page.items if not item.path.startswith(reserved))
        if page.next_after is None:
            return
        after = page.next_after
