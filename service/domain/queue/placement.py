"""Where a job runs on this host: the kind of resource it needs, whether it can ever fit, and
the device and backend that follow from what it was given.

One place for the capacity check: at submit (``service.domain.intake.submission``) and again before each
scheduling pass (a restart with fewer GPUs or slots can leave a queued job that never fits).
"""

from dataclasses import dataclass

from service.domain.queue import scheduler
from service.domain.queue.inventory import Inventory
from torchyard_contract.placement import backend_for
from torchyard_contract.spec import Device, JobSpec


@dataclass(frozen=True)
class Placement:
    """Where a job runs: the resources it holds and the device/backend that follows."""

    resources: list[str]
    device: str
    backend: str
    gpu_indices: list[int]


def resource_kind(device: str, inventory: Inventory) -> str:
    """``cuda`` → GPUs; ``auto`` → GPUs when the host has them; else CPU slots."""
    wants_gpu = device == Device.cuda.value or (device == Device.auto.value and bool(inventory.gpus))
    return scheduler.GPU if wants_gpu else scheduler.CPU


def capacity_shortfall(kind: str, count: int, inventory: Inventory) -> str | None:
    """Why ``count`` resources of ``kind`` can never be held on this host, naming the field;
    None when they can."""
    have = len(inventory.resource_names(kind))
    if count <= have:
        return None
    unit = "GPUs" if kind == scheduler.GPU else "CPU slots"
    return f"nproc_per_node: needs {count} {unit}; this host has {have}"


def placement_for(spec: JobSpec, resources: list[str]) -> Placement:
    """The device and backend that follow from the resources a job was given: GPUs → ``cuda``
    with NCCL (unless the spec asks for gloo); CPU slots → ``cpu`` with gloo."""
    if resources and resources[0].startswith("gpu:"):
        backend = backend_for("cuda", spec.backend.value)
        return Placement(resources, "cuda", backend, [int(r.split(":")[1]) for r in resources])
    return Placement(resources, "cpu", backend_for("cpu"), [])
