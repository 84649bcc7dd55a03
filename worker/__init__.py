"""torchyard's worker: the program torchrun starts once per rank.

``worker.report(epoch=..., step=None, **metrics)`` reports metrics for the calling rank
through one process-wide :class:`~worker.reporter.Reporter`, created on first use from the
environment and closed at interpreter exit. No torch import here, on purpose.
"""

from __future__ import annotations

import atexit
import threading
from typing import Any

from worker.env import WorkerEnv
from worker.reporter import Reporter

__all__ = ["Reporter", "WorkerEnv", "default_reporter", "report"]

_default: Reporter | None = None
_default_lock = threading.Lock()


def default_reporter() -> Reporter:
    """The process-wide reporter, built from the environment (:meth:`WorkerEnv.current`) on first call."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Reporter(WorkerEnv.current())
            atexit.register(_default.close)
        return _default


def report(*, epoch: int | None = None, step: int | None = None, **metrics: Any) -> None:
    """Report ``metrics`` for this rank; see :meth:`Reporter.report`."""
    default_reporter().report(epoch=epoch, step=step, **metrics)
