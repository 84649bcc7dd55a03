"""Free space under ``TORCHYARD_HOME`` and the floor below which nothing new is accepted.

Contract: :func:`free_bytes` is the space an unprivileged writer may still use under the home
(``statvfs`` ``f_bavail``); :func:`check_floor` raises :class:`DiskFull` (answered 507) when it
is below ``TORCHYARD_DISK_FREE_FLOOR_BYTES``. Running jobs are never stopped for it: only new
submissions and uploads are refused, so the space left is theirs.
"""

import os
from pathlib import Path

from service.settings import Settings


class DiskFull(OSError):
    """Free space under the home is below the configured floor."""


def free_bytes(home: Path) -> int:
    path = home if home.exists() else home.parent
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def check_floor(settings: Settings) -> None:
    floor = settings.disk_free_floor_bytes
    if not floor:
        return
    free = free_bytes(settings.home)
    if free < floor:
        raise DiskFull(
            f"only {free} bytes are free under TORCHYARD_HOME ({settings.home}), below the floor "
            f"of {floor} (TORCHYARD_DISK_FREE_FLOOR_BYTES); new jobs and uploads are refused "
            "until space is freed (DELETE /jobs/{id} or TORCHYARD_RETENTION_DAYS); running "
            "jobs carry on"
        )
