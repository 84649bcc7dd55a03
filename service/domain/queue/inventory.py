"""The host's schedulable resources: GPUs (detected without torch) or CPU slots."""

from collections.abc import Callable
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


def make_inventory(
    gpus_setting: str | None, cpu_slots: int, detect_gpus: Callable[[], tuple[int, ...]] = tuple
) -> Inventory:
    """The host's resources: ``TORCHYARD_GPUS`` when set, else what ``detect_gpus`` finds
    (``service.executor.gpus.detect_gpus`` on a server; none by default)."""
    gpus = parse_gpu_list(gpus_setting) if gpus_setting is not None else detect_gpus()
    return Inventory(gpus=gpus, cpu_slots=cpu_slots)
