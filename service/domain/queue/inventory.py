"""The host's schedulable resources: GPUs (detected without torch) or CPU slots."""

import shutil
import subprocess
from dataclasses import dataclass


@dataclass(frozen=True)
class Inventory:
    gpus: tuple[int, ...]
    cpu_slots: int

    def resource_names(self, kind: str) -> list[str]:
        if kind == "gpu":
            return [f"gpu:{i}" for i in self.gpus]
        return [f"cpu:{i}" for i in range(self.cpu_slots)]


def parse_gpu_list(value: str) -> tuple[int, ...]:
    """``'0,1,3'`` → (0, 1, 3); ``'none'`` or ``''`` → ()."""
    value = value.strip().lower()
    if value in ("", "none"):
        return ()
    return tuple(sorted({int(part) for part in value.split(",") if part.strip()}))


def detect_gpus() -> tuple[int, ...]:
    """GPU indices from ``nvidia-smi`` (no torch import in the server); () when there is none."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return ()
    try:
        out = subprocess.run(
            [exe, "--query-gpu=index", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return ()
    return tuple(int(line) for line in out.split() if line.strip().isdigit())


def make_inventory(gpus_setting: str | None, cpu_slots: int) -> Inventory:
    gpus = parse_gpu_list(gpus_setting) if gpus_setting is not None else detect_gpus()
    return Inventory(gpus=gpus, cpu_slots=cpu_slots)
