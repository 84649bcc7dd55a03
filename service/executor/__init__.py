"""Executors: how a job's processes are started, watched, adopted, cancelled and found
(see :mod:`service.executor.base`). ``make_executor`` builds the configured one."""

from __future__ import annotations

from typing import TYPE_CHECKING

from service.executor.base import Executor

if TYPE_CHECKING:
    from service.settings import Settings
    from service.warm.pool import WarmPool

# Importing this package must stay cheap: the per-job shim imports service.executor.process on
# every job's start path, so the executors (and pydantic settings) load only in make_executor.


def make_executor(settings: Settings, warm: WarmPool | None = None) -> Executor:
    """The executor ``settings.executor`` names (``TORCHYARD_EXECUTOR``)."""
    from service.executor.local import LocalExecutor

    if settings.executor == "local":
        return LocalExecutor(warm=warm, standby=True)  # the shim runs on the server's python; its torchrun on settings'
    raise ValueError(f"executor: {settings.executor!r} is not one of: local")
