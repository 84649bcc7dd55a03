"""torchyard's worker: the built-in trainer, and the SDK a user's own training script imports.

SDK (cheap to import: no torch import here, on purpose)::

    import worker
    from worker import checkpoint          # imports torch

    @worker.record                          # torch's @record: the job's reason names the rank
    def main():
        ...set-up...
        worker.ready()                      # optional: set-up done (see below)
        for epoch in ...:
            worker.report(epoch=epoch, loss=loss, accuracy=acc)
            checkpoint.save({"model": model.state_dict()}, epoch)   # rank 0 only
            if worker.should_stop():        # paused: the checkpoint above is where it resumes
                return

* :func:`report` ``(epoch=..., step=None, **metrics)`` reports metrics for the calling rank
  through one process-wide :class:`~worker.reporter.Reporter`, created on first use from the
  environment and closed at interpreter exit (pending records get up to 10 s; every record is
  also in the rank's spool file, which the server re-ingests when the job ends, unless it was
  cancelled). A record the server would refuse (a metric name outside
  ``[A-Za-z0-9_.:/-]{1,64}``, a negative epoch) raises ``ValueError`` naming it, and nothing of
  that call is reported. It also calls :func:`ready`.
* :func:`ready` writes this rank's ready marker ``RUN_DIR/attempts/<n>/ready-rank-<r>`` on the
  first call and touches it (at most once a second) on later ones. The marker means "set-up
  done": the job turns ``running`` once rank 0 is ready, a failure before every rank is ready
  is a *start-up failure* (never retried), and ``heartbeat_timeout_s`` counts from the last
  touch. A script that never reports has no heartbeat and every failure of it is a start-up one.
* :func:`should_stop` is True when the job is being paused: call it on every rank at each
  epoch's end (it is a collective once a process group exists), and when True save a
  checkpoint and return; the resumed job goes on from it (``worker.stopping``).
* :func:`params` returns a sweep trial's parameters (``{"lr": 0.01, …}``, from
  ``TORCHYARD_PARAMS``; docs/sweeps.md); ``{}`` in a job that is not a trial.
* Outside torchyard (no ``TORCHYARD_*`` variables: plain ``torchrun`` or ``python``) all of this
  is a no-op with one logged warning per process, so the same file runs anywhere.
"""

import atexit
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from torchyard_contract.rundir import RunDir
from worker.env import WorkerEnv
from worker.heartbeat import Heartbeat
from worker.reporter import Reporter
from worker.stopping import should_stop

__all__ = [
    "Reporter", "WorkerEnv", "default_reporter", "params", "ready", "record", "report",
    "should_stop",
]

F = TypeVar("F", bound=Callable[..., Any])

_default: Reporter | None = None
_default_lock = threading.Lock()
_heartbeat: Heartbeat | None = None
_heartbeat_lock = threading.Lock()


def default_reporter() -> Reporter:
    """The process-wide reporter, built from the environment (:meth:`WorkerEnv.current`) on first call."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Reporter(WorkerEnv.current())
            atexit.register(_default.close)
        return _default


def ready() -> None:
    """Mark this rank ready (first call) and alive (later calls); a no-op outside torchyard."""
    global _heartbeat
    with _heartbeat_lock:
        if _heartbeat is None:
            env = WorkerEnv.current()
            if env.run_dir is None:
                return
            marker = RunDir(env.run_dir).ready_marker(env.attempt, env.rank)
            _heartbeat = Heartbeat(marker)
            return
        _heartbeat.beat()


def report(*, epoch: int | None = None, step: int | None = None, **metrics: Any) -> None:
    """Report ``metrics`` for this rank (see :meth:`Reporter.report`); also :func:`ready`."""
    ready()
    default_reporter().report(epoch=epoch, step=step, **metrics)


def params() -> dict[str, Any]:
    """A sweep trial's parameters (name → value); ``{}`` when this job is not a trial."""
    return dict(WorkerEnv.current().params)


def record(fn: F) -> F:
    """torch's ``torch.distributed.elastic.multiprocessing.errors.record`` (imported lazily).

    Decorate the script's ``main``: an exception in a rank is written to torchrun's error file,
    so a failed job's ``reason`` reads ``rank N failed: <exception>``.
    """
    from torch.distributed.elastic.multiprocessing.errors import record as torch_record

    return torch_record(fn)
