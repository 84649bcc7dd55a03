"""A job's artifacts: the files it left in ``TORCHYARD_OUTPUT_DIR``, its checkpoints, and the
TensorBoard event files the server writes for it.

What a job wrote is hostile. Contract:

* :func:`list_artifacts` walks the output directory (and ``RUN_DIR/checkpoints`` as
  ``checkpoints/...``, ``RUN_DIR/tensorboard`` as ``tensorboard/...``) without following any
  symlink and lists regular files only: a symlink, a FIFO, a socket or a device is never listed.
  Sorted by path; ``after`` is the cursor. ``checkpoints/`` is reserved (the output directory's
  own is not listed); ``tensorboard/`` is shared: the server's event files and the output
  directory's own ``tensorboard/`` folder are listed together, the server's first where a path
  is in both.
* :func:`open_artifact` opens one by its listed path, one component at a time relative to the
  directory's descriptor with ``O_NOFOLLOW`` (a symlink anywhere on the way is refused, even one
  swapped in after listing), non-blocking (a FIFO never blocks the server), and answers only a
  regular file; ``..``, absolute paths, NUL and empty components are refused. It returns an
  open descriptor and its ``stat``: what is served is what was checked.
"""

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from torchyard_contract.rundir import RunDir

CHECKPOINTS_PREFIX = "checkpoints"  # a top-level name of the listing reserved for them
TENSORBOARD_PREFIX = "tensorboard"  # the server's event files, beside the outputs' own folder


class ArtifactNotFound(LookupError):
    pass


@dataclass(frozen=True)
class Artifact:
    path: str
    size: int
    modified: float


def _roots(run: RunDir) -> list[tuple[str, Path]]:
    """Where the listing's paths come from, the first holding a path winning."""
    return [(f"{TENSORBOARD_PREFIX}/", run.tensorboard_dir),
            (f"{CHECKPOINTS_PREFIX}/", run.checkpoints_dir), ("", run.output_dir)]


def _walk(root: Path, prefix: str) -> list[Artifact]:
    found: list[Artifact] = []
    stack = [(root, prefix)]
    while stack:
        directory, rel = stack.pop()
        try:
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
            elif stat.S_ISREG(st.st_mode) and not entry.name.startswith("."):  # not temp files
                found.append(Artifact(name, st.st_size, st.st_mtime))
    return found


def list_artifacts(run: RunDir, after: str | None, limit: int) -> list[Artifact]:
    found: dict[str, Artifact] = {}
    for prefix, root in _roots(run):
        for item in _walk(root, prefix):
            found.setdefault(item.path, item)
    items = sorted(found.values(), key=lambda a: a.path)
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


def output_files(run: RunDir) -> list[Artifact]:
    """The output directory's own files (no checkpoints, no server event files), by path."""
    return sorted(_walk(run.output_dir, ""), key=lambda a: a.path)


def open_artifact(run: RunDir, path: str) -> tuple[int, os.stat_result]:
    """An open read-only descriptor of the artifact and its stat (the caller closes it)."""
    parts = _parts(path)
    if parts[0] == CHECKPOINTS_PREFIX and len(parts) > 1:
        return _open_in(run.checkpoints_dir, parts[1:], path)
    if parts[0] == TENSORBOARD_PREFIX and len(parts) > 1:
        try:
            return _open_in(run.tensorboard_dir, parts[1:], path)
        except ArtifactNotFound:
            pass  # the output directory's own tensorboard/ folder
    return _open_in(run.output_dir, parts, path)


def open_output(run: RunDir, path: str) -> tuple[int, os.stat_result]:
    """As :func:`open_artifact`, for a path of :func:`output_files` (the output directory)."""
    return _open_in(run.output_dir, _parts(path), path)


def _open_in(root: Path, parts: list[str], path: str) -> tuple[int, os.stat_result]:
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
    except OSError:
        raise ArtifactNotFound(f"no artifact {path[:200]!r}") from None
    finally:
        os.close(fd)
    st = os.fstat(leaf)
    if not stat.S_ISREG(st.st_mode):
        os.close(leaf)
        raise ArtifactNotFound(f"no artifact {path[:200]!r} (not a regular file)")
    os.set_blocking(leaf, True)
    return leaf, st
