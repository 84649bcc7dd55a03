"""Stacks on demand: ``GET /jobs/<id>/stacks`` of a running 8-rank job, wall time (issue 25).

A script job whose 8 ranks loop (a heartbeat, a short sleep) on a real server with 8 CPU slots;
the figure is the request's wall time as a client sees it: the attempt loop's next poll (≤ 0.2 s), one
``py-spy dump`` per rank in parallel, the answer through the run directory.
"""

import os
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from bench.common import Row, percentile
from bench.server import REPO_ROOT, Server, wait_job_processes_gone

TOKEN = "bench-stacks-token-0123456789abcdef01"
RANKS = 8
SCRIPT = """
import time
import worker

while True:
    worker.ready()
    time.sleep(0.05)
"""
GOAL = "≤ 2 s"


def _wait_ready(server: Server, job_id: int, client: httpx.Client, ranks: int) -> None:
    """Every rank past set-up and the job ``running`` (stacks are taken of a running job)."""
    attempt = server.home / "runs" / str(job_id) / "attempts" / "1"
    deadline = time.monotonic() + 120
    while not all((attempt / f"ready-rank-{r}").exists() for r in range(ranks)) or \
            client.get(f"/jobs/{job_id}").json()["state"] != "running":
        if time.monotonic() > deadline:
            raise RuntimeError(f"ranks not ready: {client.get(f'/jobs/{job_id}').json()}")
        time.sleep(0.1)


def run(smoke: bool) -> list[Row]:
    repeats = 2 if smoke else 10
    ranks = 2 if smoke else RANKS  # smoke: the path, not the figure (8 cold ranks are ~30 CPU-s)
    with tempfile.TemporaryDirectory(prefix="bench-stacks-") as tmp:
        scripts = Path(tmp) / "scripts"
        scripts.mkdir()
        (scripts / "loop.py").write_text(SCRIPT)
        env = {"TORCHYARD_SCRIPT_DIRS": str(scripts), "TORCHYARD_API_TOKENS": TOKEN,
               "TORCHYARD_CPU_SLOTS": str(ranks), "TORCHYARD_WARM_RANKS": "false",
               "TORCHYARD_STOP_GRACE_S": "2",
               "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
        with (Server.start(Path(tmp) / "home", env=env) as server,
              httpx.Client(base_url=server.url, timeout=60,
                           headers={"Authorization": f"Bearer {TOKEN}"}) as client):
            job_id = client.post("/jobs", json={"entrypoint": "loop.py", "nproc_per_node": ranks,
                                                "heartbeat_timeout_s": None}).json()["id"]
            try:
                _wait_ready(server, job_id, client, ranks)
                walls, took = [], []
                for _ in range(repeats):
                    started = time.monotonic()
                    r = client.get(f"/jobs/{job_id}/stacks")
                    walls.append(time.monotonic() - started)
                    r.raise_for_status()
                    body = r.json()
                    if len(body["ranks"]) != ranks or body["error"]:
                        raise RuntimeError(f"stacks incomplete: {body['error']}")
                    took.append(body["took_s"])
            finally:
                client.post(f"/jobs/{job_id}/cancel")
                # Ended, and its group gone, before the server and its directory go (its ranks
                # write there until the stop grace's SIGKILL).
                client.get(f"/jobs/{job_id}/wait", params={"timeout": 30})
                wait_job_processes_gone(server.home, job_id)
    what = f"{ranks} ranks, {repeats} requests"
    return [
        Row("stacks", f"{ranks} ranks on demand: wall (median)", statistics.median(walls), "s",
            GOAL, what),
        Row("stacks", f"{ranks} ranks on demand: wall (max)", max(walls), "s", GOAL, what),
        Row("stacks", f"{ranks} ranks: sampling in the attempt loop (p50)", percentile(took, 50), "s", "",
            "py-spy dump of every rank, in parallel"),
    ]
