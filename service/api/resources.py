"""``GET /resources``: the host's GPUs and CPU slots, and which job holds each."""

from __future__ import annotations

from dataclasses import asdict

from fastapi import APIRouter, Request

from service.api.deps import SupervisorDep
from service.schemas import ResourceRead, ResourcesRead, ResourceTotals, WarmRead

router = APIRouter(tags=["scheduling"])


@router.get("/resources", response_model=ResourcesRead)
def read_resources(supervisor: SupervisorDep, request: Request) -> ResourcesRead:
    """Totals per kind, every resource with the job holding it (null when free), and the
    warm-rank pool (null when warm ranks are off)."""
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
    pool = request.app.state.warm
    warm = None
    if pool is not None:
        status = asdict(pool.status())
        status.pop("pid")
        warm = WarmRead(**status)
    return ResourcesRead(gpu=totals["gpu"], cpu=totals["cpu"], items=items, warm=warm)
