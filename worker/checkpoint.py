"""Epoch checkpoints on local disk: atomic saves, keep-last-K pruning, corrupt-tolerant loads.

Public API:

* :func:`save_checkpoint` ``(directory, epoch, state, keep) -> Path`` writes
  ``directory/epoch-000005.pt`` atomically and prunes all but the newest ``keep`` files.
* :func:`load_latest` ``(directory=None) -> dict | None`` returns the newest readable checkpoint.

For user scripts (the SDK):

* :func:`save` ``(state, epoch, keep=2, directory=None) -> Path | None``: on rank 0 (``RANK``)
  only, :func:`save_checkpoint` into :func:`default_dir`; other ranks do nothing and get None.
  No collective: call it on every rank.
* :func:`load_latest` without a directory reads :func:`default_dir`, and when that holds
  none, the checkpoints of the job named by the spec's ``resume_from``
  (``TORCHYARD_RESUME_DIR``). So a restarted attempt (``max_restarts``) or a ``resume_from``
  job continues where the last checkpoint left off.
* :func:`default_dir`: ``$TORCHYARD_RUN_DIR/checkpoints`` in a torchyard job, else
  ``./checkpoints`` (plain ``torchrun``).

Contract:

* **One saver per directory.** In a DDP job only rank 0 saves; the *caller* decides that
  (this module runs no collectives and never looks at the rank). Every rank may load.
* A save writes to a hidden temp file in the same directory, ``fsync``\\ s it, then
  ``os.replace``\\ s it onto the final name (and fsyncs the directory), so a reader sees
  either the old set of files or the complete new one, never a partial ``epoch-*.pt``.
  Stale temp files left by a crashed saver are removed by the next save.
* The saved object is ``{**state, "epoch": epoch}``; :func:`load_latest` returns it as is.
* :func:`load_latest` ignores temp files and anything not named ``epoch-<digits>.pt``; if the
  newest file cannot be read (truncated, corrupt, not a dict) it logs a warning and falls
  back to the next older one. ``None`` when the directory is missing or holds none.
* Files are written with ``torch.save`` and read with
  ``torch.load(weights_only=False, map_location="cpu")``: they are our own files, never
  load checkpoints from an untrusted directory.
"""

import logging
import os
import re
import tempfile
from pathlib import Path
from typing import Any

import torch

from torchyard_contract.rundir import RunDir
from worker import ready
from worker.env import WorkerEnv

log = logging.getLogger(__name__)

_NAME = re.compile(r"^epoch-(\d+)\.pt$")
_TMP_PREFIX = ".epoch-"
_TMP_SUFFIX = ".tmp"


def checkpoint_name(epoch: int) -> str:
    """File name of the checkpoint for ``epoch``: ``epoch-000005.pt``."""
    return f"epoch-{epoch:06d}.pt"


def list_checkpoints(directory: Path | str) -> list[tuple[int, Path]]:
    """Complete checkpoint files in ``directory`` as ``(epoch, path)``, oldest first."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = []
    for path in directory.iterdir():
        match = _NAME.match(path.name)
        if match and path.is_file():
            found.append((int(match.group(1)), path))
    return sorted(found)


def save_checkpoint(directory: Path | str, epoch: int, state: dict[str, Any], keep: int) -> Path:
    """Atomically write ``{**state, "epoch": epoch}`` for ``epoch``; keep the newest ``keep``.

    Returns the final path. Raises ``ValueError`` for ``epoch < 0`` or ``keep < 1``; I/O
    errors propagate (the temp file is removed).
    """
    if epoch < 0:
        raise ValueError(f"epoch must be >= 0, got {epoch}")
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    _remove_stale_temps(directory)
    final = directory / checkpoint_name(epoch)
    fd, tmp_name = tempfile.mkstemp(
        dir=directory, prefix=f"{_TMP_PREFIX}{epoch:06d}-", suffix=_TMP_SUFFIX
    )
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as handle:
            torch.save({**state, "epoch": epoch}, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(directory)
    for _, old in list_checkpoints(directory)[:-keep]:
        old.unlink(missing_ok=True)
    return final


def default_dir() -> Path:
    """Where :func:`save` writes: the job's ``RUN_DIR/checkpoints``, else ``./checkpoints``."""
    env = WorkerEnv.current()
    return RunDir(env.run_dir).checkpoints_dir if env.run_dir is not None else Path("checkpoints")


def save(
    state: dict[str, Any], epoch: int, *, keep: int = 2, directory: Path | str | None = None
) -> Path | None:
    """Rank 0 saves ``state`` for ``epoch`` atomically (see :func:`save_checkpoint`); others: None."""
    if WorkerEnv.current().rank != 0:
        return None
    path = save_checkpoint(directory if directory is not None else default_dir(), epoch, state, keep)
    ready()  # a slow save is progress too
    return path


def load_latest(directory: Path | str | None = None) -> dict[str, Any] | None:
    """The newest readable checkpoint in ``directory`` (see module docstring), or ``None``.

    ``directory=None``: :func:`default_dir`, then the ``resume_from`` job's checkpoints.
    """
    if directory is None:
        resume_dir = WorkerEnv.current().resume_dir
        own = _load_latest_in(default_dir())
        if own is not None or resume_dir is None:
            return own
        return _load_latest_in(resume_dir)
    return _load_latest_in(directory)


def _load_latest_in(directory: Path | str) -> dict[str, Any] | None:
    for epoch, path in reversed(list_checkpoints(directory)):
        try:
            state = torch.load(path, map_location="cpu", weights_only=False)
        except Exception as exc:  # noqa: BLE001 - any unreadable file means "try the older one"
            log.warning("checkpoint %s unreadable (%s); trying an older one", path, exc)
            continue
        if not isinstance(state, dict):
            log.warning("checkpoint %s holds %s, not a dict; skipped", path, type(state).__name__)
            continue
        state.setdefault("epoch", epoch)
        return state
    return None


def _remove_stale_temps(directory: Path) -> None:
    for path in directory.iterdir():
        if path.name.startswith(_TMP_PREFIX) and path.name.endswith(_TMP_SUFFIX):
            path.unlink(missing_ok=True)


def _fsync_dir(directory: Path) -> None:
    """Make the rename durable; a no-op where directories cannot be opened (Windows)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
