"""A job's artifacts: which of the files it left may be served, and opening one safely.

What a job wrote is hostile. Contract:

* :func:`served` says what may be served: a regular file with one link, owned by the uid the
  job runs as (:func:`job_uid`; in ``tensorboard/``, the server's event files, the server's
  own: :func:`owner_under`): only what the job's own user could have written, never a hard
  link to a file of the server or of another job (whoever made the link). A symlink, a FIFO, a
  socket or a device is never served. The listing (``service.domain.files.artifactlisting``)
  lists only what this serves.
* :func:`open_artifact` opens one by its listed path (names as
  ``service.domain.files.artifactnames`` writes them), one component at a time relative to the
  directory's descriptor with ``O_NOFOLLOW`` (a symlink anywhere on the way is refused, even
  one swapped in after listing), non-blocking (a FIFO never blocks the server), and answers
  only what :func:`served` allows, checked before it is opened (opening a device can do
  things) and again on the open descriptor; ``..``, absolute paths, NUL and empty components
  are refused. It returns an open descriptor and its ``stat``: what is served is what was
  checked.
"""

import os
import stat
from pathlib import Path

from service.domain.files.artifactnames import name_bytes
from torchyard_contract.rundir import RunDir

CHECKPOINTS_PREFIX = "checkpoints"  # a top-level name of the listing reserved for them
# The server's TensorBoard event files (``service.domain.tracking``), reserved as checkpoints/ is.
TENSORBOARD_PREFIX = "tensorboard"


def reserved_roots(run: RunDir) -> dict[str, Path]:
    """The listing's reserved top-level names and the directories they stand for."""
    return {CHECKPOINTS_PREFIX: run.checkpoints_dir, TENSORBOARD_PREFIX: run.tensorboard_dir}


def owner_under(top: str, owner_uid: int) -> int:
    """Whose files are served under the top-level name ``top``: the server's own in
    ``tensorboard/`` (it writes them), the job's everywhere else."""
    return os.geteuid() if top == TENSORBOARD_PREFIX else owner_uid


class ArtifactNotFound(LookupError):
    pass


def job_uid(run: RunDir) -> int:
    """The uid a job's processes run as: the owner of its run directory, which is handed to the
    team's Unix user before the job starts (``service.domain.files.runowner``) and is the
    server's own otherwise. A run directory that cannot be read names no one (-1: nothing is
    served)."""
    try:
        return os.lstat(run.root).st_uid
    except OSError:
        return -1


def served(st: os.stat_result, owner_uid: int) -> bool:
    """Whether a file with this ``lstat`` may be served for a job that runs as ``owner_uid``."""
    return stat.S_ISREG(st.st_mode) and st.st_nlink == 1 and st.st_uid == owner_uid


def _parts(path: str) -> list[bytes]:
    """A listed path's names; an absolute or empty path has an empty one (refused)."""
    parts = [name_bytes(p) for p in path.split("/")]
    if any(p is None for p in parts):
        raise ArtifactNotFound(f"no artifact {path[:200]!r}")
    return parts  # type: ignore[return-value]


def open_artifact(run: RunDir, path: str, owner_uid: int) -> tuple[int, os.stat_result]:
    """An open read-only descriptor of the artifact and its stat (the caller closes it).
    ``checkpoints/…`` and ``tensorboard/…`` are read from their own directories (a path of the
    output directory's own ``tensorboard/`` folder that the server's does not hold is read from
    the output directory)."""
    parts = _parts(path)
    top = parts[0].decode("utf-8", "surrogateescape")
    roots = reserved_roots(run)
    if top in roots and len(parts) > 1:
        try:
            return _open_in(roots[top], parts[1:], path, owner_under(top, owner_uid))
        except ArtifactNotFound:
            if top != TENSORBOARD_PREFIX:
                raise
    return _open_in(run.output_dir, parts, path, owner_uid)


def open_output(run: RunDir, path: str) -> tuple[int, os.stat_result]:
    """As :func:`open_artifact`, in the output directory only (what ``log_outputs`` uploads)."""
    return _open_in(run.output_dir, _parts(path), path, job_uid(run))


def _open_in(
    root: Path, parts: list[bytes], path: str, owner_uid: int
) -> tuple[int, os.stat_result]:
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        raise ArtifactNotFound(f"no artifact {path[:200]!r}") from None
    try:
        for part in parts[:-1]:
            nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = nxt
        if not served(os.stat(parts[-1], dir_fd=fd, follow_symlinks=False), owner_uid):
            raise ArtifactNotFound(f"no artifact {path[:200]!r} (only regular files with one "
                                   "link, owned by the job's user, are served)")
        leaf = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=fd)
    except OSError:
        raise ArtifactNotFound(f"no artifact {path[:200]!r}") from None
    finally:
        os.close(fd)
    st = os.fstat(leaf)
    if not served(st, owner_uid):
        os.close(leaf)
        raise ArtifactNotFound(f"no artifact {path[:200]!r} (replaced while it was opened)")
    os.set_blocking(leaf, True)
    return leaf, st
