"""``GET /resources``: the host's GPUs and CPU slots, and which job holds each."""

from __future__ import annotations

from fastapi import APIRouter

from service.api.deps import SupervisorDep
from service.schemas import ResourceRead, ResourcesRead, ResourceTotals

router = APIRouter(tags=["scheduling"])


@router.get("/resources", response_model=ResourcesRead)
def read_resources(supervisor: SupervisorDep) -> ResourcesRead:
    """Totals per kind, and every resource with the job holding it (null when free)."""
    kinds, held = supervisor.resources()
    items = [
        ResourceRead(name=name, kind=kind, job_id=held.get(name))  # type: ignore[arg-type]
        for kind, names in kinds.items()
        for name in names
    ]
    totals = {}
    for kind, names in kinds.items():
        allocated = sum(1 for n in names if n in held)
        totals[kind] = ResourceTotals(total=len(names), allocated=allocated, free=len(names) - allocated)
    return ResourcesRead(gpu=totals["gpu"], cpu=totals["cpu"], items=items)
