"""A job's artifacts: the files it left in ``TORCHYARD_OUTPUT_DIR`` and its checkpoints.

What a job wrote is hostile. Contract:

* :func:`list_artifacts` walks the output directory (and ``RUN_DIR/checkpoints`` as
  ``checkpoints/...``) without following any symlink and lists regular files only: a symlink,
  a FIFO, a socket or a device is never listed. Sorted by path; ``after`` is the cursor.
* :func:`open_artifact` opens one by its listed path, one component at a time relative to the
  directory's descriptor with ``O_NOFOLLOW`` (a symlink anywhere on the way is refused, even one
  swapped in after listing), non-blocking (a FIFO never blocks the server), and answers only a
  regular file — of the job's own user, where its run directory is that user's
  (``safefile.foreign``: never a hard link to someone else's file); ``..``, absolute paths, NUL
  and empty components are refused. It returns an
  open descriptor and its ``stat``: what is served is what was checked.
"""

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from torchyard_contract.rundir import RunDir
from torchyard_contract.safefile import foreign

CHECKPOINTS_PREFIX = "checkpoints"  # a top-level name of the listing reserved for them


class ArtifactNotFound(LookupError):
    pass


@dataclass(frozen=True)
class Artifact:
    path: str
    size: int
    modified: float


def _roots(run: RunDir) -> list[tuple[str, Path]]:
    return [("", run.output_dir), (f"{CHECKPOINTS_PREFIX}/", run.checkpoints_dir)]


def _walk(root: Path, prefix: str) -> list[Artifact]:
    found: list[Artifact] = []
    stack = [(root, prefix)]
    while stack:
        directory, rel = stack.pop()
        try:
            dir_st = os.lstat(directory)
            entries = list(os.scandir(directory))
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            continue
        for entry in entries:
            name = f"{rel}{entry.name}"
            if not prefix and rel == "" and entry.name == CHECKPOINTS_PREFIX:
                continue  # reserved for RUN_DIR/checkpoints
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode):
                stack.append((Path(entry.path), f"{name}/"))
            elif stat.S_ISREG(st.st_mode) and not entry.name.startswith(".") \
                    and not foreign(st, dir_st):  # not temp files, not another user's
                found.append(Artifact(name, st.st_size, st.st_mtime))
    return found


def list_artifacts(run: RunDir, after: str | None, limit: int) -> list[Artifact]:
    items: list[Artifact] = []
    for prefix, root in _roots(run):
        items += _walk(root, prefix)
    items.sort(key=lambda a: a.path)
    if after is not None:
        items = [a for a in items if a.path > after]
    return items[:limit]


def _parts(path: str) -> list[str]:
    if not path or "\x00" in path or path.startswith("/"):
        raise ArtifactNotFound(f"no artifact {path[:200]!r}")
    parts = path.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise ArtifactNotFound(f"no artifact {path[:200]!r}")
    return parts


def open_artifact(run: RunDir, path: str) -> tuple[int, os.stat_result]:
    """An open read-only descriptor of the artifact and its stat (the caller closes it)."""
    parts = _parts(path)
    root = run.output_dir
    if parts[0] == CHECKPOINTS_PREFIX and len(parts) > 1:
        root, parts = run.checkpoints_dir, parts[1:]
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        raise ArtifactNotFound(f"no artifact {path[:200]!r}") from None
    try:
        for part in parts[:-1]:
            nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = nxt
        leaf = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=fd)
        dir_st = os.fstat(fd)
    except OSError:
        raise ArtifactNotFound(f"no artifact {path[:200]!r}") from None
    finally:
        os.close(fd)
    st = os.fstat(leaf)
    if not stat.S_ISREG(st.st_mode) or foreign(st, dir_st):
        os.close(leaf)
        raise ArtifactNotFound(f"no artifact {path[:200]!r} (not a regular file)")
    os.set_blocking(leaf, True)
    return leaf, st
