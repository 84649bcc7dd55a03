"""Pause and preemption (issue 25): how soon a pause frees a job's slots, and how soon an urgent
job runs when a preemptible one holds every slot.

(a) A 2-rank built-in job (digits + mlp) on a warm server: ``POST /jobs/<id>/pause`` → its
slots free (``GET /resources``, polled every 20 ms), then resume and wait for a new epoch;
repeated. Beside it, the baseline the goal names: one checkpoint of the same model written with
``worker.checkpoint.save_checkpoint`` in this process.

(b) A preemptible 4-rank job holds all 4 slots; an urgent script job (priority 10, 2 ranks)
whose first statement records ``time.time()`` is submitted: ``POST`` → that first statement,
against the same script submitted to an idle server (the start-up it would have anyway).
"""

import os
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from bench.common import Row, percentile
from bench.server import REPO_ROOT, Server

TOKEN = "bench-pause-api-token-0123456789abcdef"
SCRIPT = """import time; T = time.time()
import os
with open(f"first-{os.environ.get('RANK', '0')}.txt", "w") as f:
    f.write(repr(T))
"""
BUILTIN = {"dataset": "digits", "model": "mlp", "nproc_per_node": 2, "epochs": 100000,
           "heartbeat_timeout_s": None}


def _wait(client: httpx.Client, job_id: int, states: set[str], timeout_s: float = 120) -> dict:
    deadline = time.monotonic() + timeout_s
    while (job := client.get(f"/jobs/{job_id}").json())["state"] not in states:
        if time.monotonic() > deadline:
            raise RuntimeError(f"job {job_id} not {states}: {job['state']} {job['reason']}")
        time.sleep(0.02)
    return job


def _losses(client: httpx.Client, job_id: int) -> int:
    """Loss records so far (both ranks), through the cursor."""
    count, after = 0, 0
    while items := client.get(f"/jobs/{job_id}/metrics",
                              params={"name": "loss", "after": after}).json()["items"]:
        count, after = count + len(items), items[-1]["seq"]
    return count


def _wait_warm(client: httpx.Client) -> None:
    deadline = time.monotonic() + 120
    while ((client.get("/resources").json().get("warm") or {}).get("state")) not in (
            "ready", "broken", None):
        if time.monotonic() > deadline:
            raise RuntimeError("warm pool not ready")
        time.sleep(0.2)


def _slots_free(client: httpx.Client, job_id: int) -> bool:
    return all(i["job_id"] != job_id for i in client.get("/resources").json()["items"])


def _checkpoint_s(repeats: int) -> float:
    """One checkpoint of the built-in mlp on digits, as the trainer writes it (median)."""
    import torch

    from worker.checkpoint import save_checkpoint
    from worker.models import build_model

    model = build_model("mlp", (1, 8, 8), 10)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    times = []
    with tempfile.TemporaryDirectory(prefix="bench-ckpt-") as tmp:
        for epoch in range(1, repeats + 1):
            started = time.perf_counter()
            save_checkpoint(Path(tmp), epoch, {"model": model.state_dict(),
                                               "optimizer": optimizer.state_dict()}, keep=2)
            times.append(time.perf_counter() - started)
    return statistics.median(times)


def _env(scripts: Path, **extra: str) -> dict[str, str]:
    return {"TORCHYARD_SCRIPT_DIRS": str(scripts), "TORCHYARD_API_TOKENS": TOKEN,
            "TORCHYARD_WARM_RANKS": "true", "TORCHYARD_STOP_GRACE_S": "2",
            "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]),
            **extra}


def _pauses(home: Path, scripts: Path, repeats: int) -> list[float]:
    with (Server.start(home, env=_env(scripts)) as server,
          httpx.Client(base_url=server.url, timeout=60,
                       headers={"Authorization": f"Bearer {TOKEN}"}) as client):
        _wait_warm(client)
        job_id = client.post("/jobs", json=BUILTIN).json()["id"]
        walls = []
        try:
            for _ in range(repeats):
                _wait(client, job_id, {"running"})
                before, since = _losses(client, job_id), time.monotonic()
                while _losses(client, job_id) <= before:  # an epoch of this attempt
                    if time.monotonic() - since > 60:
                        raise RuntimeError("no epoch reported")
                    time.sleep(0.05)
                started = time.monotonic()
                client.post(f"/jobs/{job_id}/pause").raise_for_status()
                while not _slots_free(client, job_id):
                    if time.monotonic() - started > 120:
                        raise RuntimeError("slots not freed")
                    time.sleep(0.02)
                walls.append(time.monotonic() - started)
                _wait(client, job_id, {"paused"})
                client.post(f"/jobs/{job_id}/resume").raise_for_status()
        finally:
            client.post(f"/jobs/{job_id}/cancel")
            client.get(f"/jobs/{job_id}/wait", params={"timeout": 30})
    return walls


def _first(run_dir: Path, timeout_s: float = 120) -> float:
    deadline = time.monotonic() + timeout_s
    while len(times := [p for p in run_dir.glob("first-*.txt") if p.stat().st_size]) < 2:
        if time.monotonic() > deadline:
            raise RuntimeError(f"no first statement in {run_dir}")
        time.sleep(0.02)
    return max(float(p.read_text()) for p in times)


def _preemptions(home: Path, scripts: Path, repeats: int) -> tuple[list[float], list[float]]:
    """(preempting: POST → first statement, idle: the same on a free server), per repeat."""
    urgent = {"entrypoint": "first.py", "nproc_per_node": 2, "priority": 10}
    preempting, idle = [], []
    with (Server.start(home, env=_env(scripts, TORCHYARD_PREEMPT_MIN_RUN_S="0")) as server,
          httpx.Client(base_url=server.url, timeout=60,
                       headers={"Authorization": f"Bearer {TOKEN}"}) as client):
        _wait_warm(client)
        low = client.post("/jobs", json={**BUILTIN, "nproc_per_node": 4,
                                         "preemptible": True}).json()["id"]
        try:
            for _ in range(repeats):
                _wait(client, low, {"running"})
                posted = time.time()
                job = client.post("/jobs", json=urgent).json()
                first = _first(server.home / "runs" / str(job["id"]))
                preempting.append(first - posted)
                _wait(client, job["id"], {"succeeded", "failed"})
                _wait(client, low, {"running"})
                # Baseline: the same job with the slots free (the low job paused by hand).
                client.post(f"/jobs/{low}/pause")
                _wait(client, low, {"paused"})
                posted = time.time()
                job = client.post("/jobs", json=urgent).json()
                idle.append(_first(server.home / "runs" / str(job["id"])) - posted)
                _wait(client, job["id"], {"succeeded", "failed"})
                client.post(f"/jobs/{low}/resume")
        finally:
            client.post(f"/jobs/{low}/cancel")
            client.get(f"/jobs/{low}/wait", params={"timeout": 30})
    return preempting, idle


def run(smoke: bool) -> list[Row]:
    repeats = 2 if smoke else 10
    with tempfile.TemporaryDirectory(prefix="bench-pause-") as tmp:
        scripts = Path(tmp) / "scripts"
        scripts.mkdir()
        (scripts / "first.py").write_text(SCRIPT)
        pauses = _pauses(Path(tmp) / "pause", scripts, repeats)
        preempting, idle = _preemptions(Path(tmp) / "preempt", scripts, max(2, repeats // 2))
    checkpoint = _checkpoint_s(5)
    what = f"2-rank digits mlp, warm, {repeats} pauses"
    return [
        Row("pause", "pause → slots free (p50)", percentile(pauses, 50), "s",
            "≤ one checkpoint + 1 s", what),
        Row("pause", "pause → slots free (max)", max(pauses), "s", "≤ one checkpoint + 1 s", what),
        Row("pause", "baseline: one checkpoint written (median)", checkpoint, "s", "",
            "worker.checkpoint.save_checkpoint, same model"),
        Row("pause", "preemption: urgent POST → first statement (median)",
            statistics.median(preempting), "s", "≤ 3 s + the preempted job's checkpoint",
            "a preemptible 4-rank job holds all 4 slots"),
        Row("pause", "baseline: same job on free slots, POST → first statement (median)",
            statistics.median(idle), "s", "", "warm ranks"),
        Row("pause", "preemption cost: ratio preempting / free slots",
            statistics.median(preempting) / statistics.median(idle), "×", "", ""),
    ]
