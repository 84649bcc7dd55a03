"""Submit → first metric on the local executor and on the Slurm executor, side by side.

The Slurm side is the test cluster (``tests/slurmcluster.py``: ``slurmctld`` and two ``slurmd``
emulating nodes on this host, no scheduling delay), so what differs is what the Slurm executor
adds: ``sbatch``, Slurm's scheduling and job launch, the batch script, ``srun`` starting a
torchrun per node, and the supervisor seeing it through ``squeue`` once per tick. The job is the
same built-in digits MLP run (1 epoch, ``checkpoint_every`` 0) in each column:

* ``local``: 1 node × 2 ranks on this host;
* ``slurm 1×2``: 1 node × 2 ranks (the same shape);
* ``slurm 2×1``: 2 nodes × 1 rank (the multi-node path: a rendezvous across nodes).

Each phase is read from the job's own times (``created_at`` → ``started_at`` → ``running_at``
→ ``first_metric_at`` → ``ended_at``) plus the client's view (POST → it sees the first metric).
Runs alternate local, slurm 1×2, slurm 2×1. Without slurm-wlm and munge the Slurm columns are
reported as missing instead of failing the other benchmarks.
"""

import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx

from bench.common import Row
from bench.server import Server
from tests.slurmcluster import SlurmCluster, missing_programs

CLIENT_POLL_S = 0.05
SHAPES = {"local": (1, 2), "slurm 1×2": (1, 2), "slurm 2×1": (2, 1)}
PHASES = (
    ("started_at", "submit → started"),
    ("running_at", "submit → running (rank 0 ready)"),
    ("first_metric_at", "submit → first metric (server)"),
    ("ended_at", "submit → ended"),
)


def _spec(nnodes: int, nproc: int) -> dict[str, object]:
    spec: dict[str, object] = {"name": "bench-slurm", "model": "mlp", "dataset": "digits",
                               "epochs": 1, "nproc_per_node": nproc, "checkpoint_every": 0,
                               "device": "cpu"}
    if nnodes > 1:
        spec["nnodes"] = nnodes
    return spec


def _ts(iso: str | None) -> float | None:
    return None if iso is None else datetime.fromisoformat(iso).replace(tzinfo=UTC).timestamp()


def run_once(server: Server, nnodes: int, nproc: int) -> dict[str, float]:
    """One job: seconds from the POST to each phase."""
    with httpx.Client(base_url=server.url, timeout=30) as client:
        t0 = time.time()
        r = client.post("/jobs", json=_spec(nnodes, nproc))
        r.raise_for_status()
        job_id = r.json()["id"]
        seen_metric = None
        while True:
            job = client.get(f"/jobs/{job_id}").json()
            if seen_metric is None and client.get(f"/jobs/{job_id}/metrics").json()["items"]:
                seen_metric = time.time() - t0  # read after the state: an end implies it is seen
            if job["state"] in ("succeeded", "failed", "cancelled"):
                break
            time.sleep(CLIENT_POLL_S)
    if job["state"] != "succeeded":
        raise RuntimeError(f"job {job_id} {job['state']}: {job['reason']}")
    created = _ts(job["created_at"]) or t0
    phases = {label: t - created for key, label in PHASES if (t := _ts(job.get(key)))}
    # When the attempt loop (the attempt loop: on Slurm, the batch script) started the first attempt's
    # torchrun (locally) or srun (Slurm): what comes before it is the executor's own cost.
    attempts = job.get("attempts") or []
    if attempts and attempts[0].get("started_at"):
        phases["submit → attempt 1 launched by the attempt loop"] = attempts[0]["started_at"] - created
    phases["submit → first metric (client saw it)"] = seen_metric or float("nan")
    return phases


def run(smoke: bool) -> list[Row]:
    repeats = 1 if smoke else 5
    missing = missing_programs()
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in SHAPES}
    with tempfile.TemporaryDirectory(prefix="bench-slurm-") as tmp:
        root = Path(tmp)
        cluster = None if missing else SlurmCluster.start(root / "cluster")
        try:
            servers = {"local": Server.start(root / "local")}
            if cluster is not None:
                servers["slurm"] = Server.start(
                    root / "slurm", env={"TORCHYARD_EXECUTOR": "slurm", **cluster.env})
            try:
                for _ in range(repeats):
                    for name, (nnodes, nproc) in SHAPES.items():
                        server = servers.get(name.split()[0])
                        if server is not None:
                            runs[name].append(run_once(server, nnodes, nproc))
            finally:
                for server in servers.values():
                    server.stop()
        finally:
            if cluster is not None:
                cluster.stop()
    return _rows(runs, repeats, missing)


def _rows(runs: dict[str, list[dict[str, float]]], repeats: int, missing: list[str]) -> list[Row]:
    rows: list[Row] = []
    med = {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in
           runs.items() if rs}
    headline = "submit → first metric (server)"
    if "local" in med and "slurm 1×2" in med:
        rows.append(Row("slurm", "slurm 1×2 − local: submit → first metric",
                        med["slurm 1×2"][headline] - med["local"][headline], "s",
                        note=f"median of {repeats}"))
    for name in SHAPES:
        if name not in med:
            rows.append(Row("slurm", f"{name}: {headline}", "n/a", "s",
                            note=f"not measured: missing {', '.join(missing)}"))
            continue
        for label, value in med[name].items():
            rows.append(Row("slurm", f"{name}: {label}", value, "s",
                            note=f"median of {repeats}"))
    return rows
