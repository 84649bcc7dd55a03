"""Executors: how a job's processes are started, watched, adopted, cancelled and found
(see :mod:`service.executor.base`). ``make_executor`` builds the configured one."""

from __future__ import annotations

from service.executor.base import Executor
from service.executor.local import LocalExecutor
from service.settings import Settings


def make_executor(settings: Settings) -> Executor:
    """The executor ``settings.executor`` names (``TORCHYARD_EXECUTOR``)."""
    if settings.executor == "local":
        return LocalExecutor()  # the shim runs on the server's python; its torchrun on settings'
    raise ValueError(f"executor: {settings.executor!r} is not one of: local")
