"""``GET /resources``: the host's GPUs and CPU slots, and which job holds each."""

from dataclasses import asdict

from fastapi import APIRouter, Request

from service.api.deps import SupervisorDep
from service.api.errors import ApiError
from service.api.schemas import NodeRead, ResourceRead, ResourcesRead, ResourceTotals, WarmRead
from service.domain.loop.supervisor import Supervisor
from service.executor.base import ExecutorError

router = APIRouter(tags=["scheduling"])


@router.get("/resources", response_model=ResourcesRead)
def read_resources(supervisor: SupervisorDep, request: Request) -> ResourcesRead:
    """Totals per kind, every resource with the job holding it (null when free; its id, name,
    owner and team only, whichever team's it is, so everyone sees who holds the box), and the
    warm-rank pool (null when warm ranks are off). On the slurm executor: the partition's nodes
    and their state (``sinfo``); GPU ``allocated`` counts the GPUs of nodes that are not idle
    (Slurm's per-GPU use is not asked for)."""
    if supervisor.executor.spans_nodes:
        return _slurm_resources(supervisor)
    kinds, held, holders = supervisor.resources()
    items = []
    for kind, names in kinds.items():
        for name in names:
            job_id = held.get(name)
            job_name, owner, team = holders.get(job_id, (None, None, None)) if job_id else (
                None, None, None)
            items.append(ResourceRead(name=name, kind=kind, job_id=job_id,  # type: ignore[arg-type]
                                      job_name=job_name, owner=owner, team=team))
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


def _slurm_resources(supervisor: Supervisor) -> ResourcesRead:
    try:
        rows = supervisor.cluster_nodes()
    except ExecutorError as exc:
        raise ApiError(503, "slurm_unavailable", f"cannot ask Slurm: {exc}") from exc
    nodes = [
        NodeRead(name=n.name, state=n.state, partition=n.partition, cpus=n.cpus,
                 cpus_allocated=n.cpus_allocated, gpus=n.gpus)
        for n in rows
    ]
    cpus = sum(n.cpus for n in nodes)
    cpus_used = sum(n.cpus_allocated for n in nodes)
    gpus = sum(n.gpus for n in nodes)
    gpus_used = sum(n.gpus for n in nodes if n.state != "idle")
    return ResourcesRead(
        executor="slurm",
        gpu=ResourceTotals(total=gpus, allocated=gpus_used, free=gpus - gpus_used),
        cpu=ResourceTotals(total=cpus, allocated=cpus_used, free=cpus - cpus_used),
        items=[],
        nodes=nodes,
    )
