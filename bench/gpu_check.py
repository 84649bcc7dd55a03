"""``python -m bench.gpu_check``: the NCCL check of warm ranks, for a host with 1–2 GPUs.

Through the service (a real ``torchyard serve`` per side, warm ranks on and off): the built-in
trainer, seed fixed, ``device=cuda`` (``backend`` auto: NCCL), on 1 GPU and, when the host has
two, 2 GPUs (2 ranks). It checks, and exits 1 naming the first failure:

* every job succeeds, warm and cold, and the warm ones really ran warm (the pool's ``served``
  grew by ranks + 1, no "starting cold" in their logs);
* the losses every rank reported are equal warm and cold (same seed, same data, same GPUs:
  a rank forked from the warm server trains as a cold one);
* the warm server never touched CUDA: ``/resources`` says ``cuda_initialized: false`` after
  the jobs, and ``nvidia-smi`` lists no GPU memory held by the warm server's pid.

Prints one line per check and a JSON summary; takes a few minutes (two servers, four to six
jobs). Not runnable without a GPU: it says so and exits 2.
"""

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from bench.server import Server

TOKEN = "bench-gpu-check-token-0123456789"
TERMINAL = ("succeeded", "failed", "cancelled")


def gpu_count() -> int:
    if shutil.which("nvidia-smi") is None:
        return 0
    done = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"],
                          capture_output=True, text=True, check=False)
    return len([line for line in done.stdout.splitlines() if line.strip()])


def gpu_pids() -> set[int]:
    done = subprocess.run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"],
                          capture_output=True, text=True, check=False)
    return {int(line) for line in done.stdout.split() if line.strip().isdigit()}


def _client(server: Server) -> httpx.Client:
    return httpx.Client(base_url=server.url, timeout=30,
                        headers={"Authorization": f"Bearer {TOKEN}"})


def warm_status(server: Server) -> dict:
    with _client(server) as c:
        return c.get("/resources").json().get("warm") or {}


def wait_ready(server: Server, idle: int) -> dict:
    deadline = time.monotonic() + 300
    while (warm := warm_status(server)).get("state") != "ready" or warm.get("idle", 0) < idle:
        if time.monotonic() > deadline:
            raise SystemExit(f"FAIL: the warm pool is not ready: {warm}")
        time.sleep(0.5)
    return warm


def run_job(server: Server, ranks: int) -> tuple[dict, dict[tuple[int, int], float], str]:
    spec = {"name": f"gpu-check-{ranks}", "model": "mlp", "dataset": "digits", "epochs": 2,
            "nproc_per_node": ranks, "device": "cuda", "seed": 0, "checkpoint_every": 0}
    with _client(server) as c:
        r = c.post("/jobs", json=spec)
        r.raise_for_status()
        job_id = r.json()["id"]
        deadline = time.monotonic() + 600
        while (job := c.get(f"/jobs/{job_id}/wait", params={"timeout": 20}).json())["state"] \
                not in TERMINAL:
            if time.monotonic() > deadline:
                raise SystemExit(f"FAIL: job {job_id} did not end: {job['state']}")
        losses: dict[tuple[int, int], float] = {}
        after = 0
        while items := c.get(f"/jobs/{job_id}/metrics",
                             params={"after": after, "name": "loss"}).json()["items"]:
            for m in items:
                if m["name"] == "loss":
                    losses[(m["rank"], m["epoch"])] = m["value"]
            after = items[-1]["seq"]
    logs = "".join(p.read_text(errors="replace")
                   for p in (server.home / "runs" / str(job_id) / "logs").glob("**/*.log"))
    return job, losses, logs


def check(ok: bool, what: str, failures: list[str]) -> None:
    print(("ok    " if ok else "FAIL  ") + what, flush=True)
    if not ok:
        failures.append(what)


def main() -> int:
    gpus = gpu_count()
    if gpus == 0:
        print("no GPU on this host (nvidia-smi finds none): nothing to check", file=sys.stderr)
        return 2
    failures: list[str] = []
    summary: dict[str, object] = {"gpus": gpus}
    env = {"TORCHYARD_API_TOKENS": TOKEN, "TORCHYARD_GPUS": ",".join(map(str, range(gpus)))}
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        root = Path(tmp)
        with (Server.start(root / "warm", env={**env, "TORCHYARD_WARM_RANKS": "true"}) as warm,
              Server.start(root / "cold", env={**env, "TORCHYARD_WARM_RANKS": "false"}) as cold):
            for ranks in [n for n in (1, 2) if n <= gpus]:
                served = wait_ready(warm, ranks + 1)["served"]
                w_job, w_loss, w_logs = run_job(warm, ranks)
                c_job, c_loss, _ = run_job(cold, ranks)
                check(w_job["state"] == "succeeded", f"{ranks} GPU(s) warm: {w_job['state']} "
                      f"{w_job.get('reason') or ''}", failures)
                check(c_job["state"] == "succeeded", f"{ranks} GPU(s) cold: {c_job['state']} "
                      f"{c_job.get('reason') or ''}", failures)
                ran_warm = warm_status(warm)["served"] >= served + ranks + 1
                check(ran_warm and "starting cold" not in w_logs,
                      f"{ranks} GPU(s): the warm job's agent and ranks were warm processes",
                      failures)
                same = bool(w_loss) and w_loss.keys() == c_loss.keys() and all(
                    abs(w_loss[k] - c_loss[k]) <= 1e-6 * max(1.0, abs(c_loss[k])) for k in w_loss)
                check(same, f"{ranks} GPU(s): losses equal warm and cold "
                      f"({len(w_loss)} values)", failures)
                summary[f"{ranks}gpu"] = {"warm": {str(k): v for k, v in sorted(w_loss.items())},
                                          "cold": {str(k): v for k, v in sorted(c_loss.items())}}
            status = warm_status(warm)
            check(status.get("cuda_initialized") is False,
                  "the warm server never initialised CUDA (/resources)", failures)
            from service.executor.warmpool import ask, socket_path

            server_pid = (ask(socket_path(warm.home), {"op": "status"}) or {}).get("pid")
            check(server_pid is not None and server_pid not in gpu_pids(),
                  "the warm server holds no GPU memory (nvidia-smi)", failures)
    summary["failures"] = failures
    print(json.dumps(summary, indent=1))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
