"""Start-up: how soon a job's code runs. Trivial script and built-in trainer, side by side.

(a) A trivial script whose first statement records ``time.time()`` into ``first-<RANK>.txt`` in
its working directory, 2 ranks: ``POST /jobs`` → every rank's first statement for a torchyard
script job with warm ranks and cold, against plain ``torchrun --standalone`` and plain ``python
script.py`` (both from ``Popen``). The four runs alternate, so load changes hit all of them.
Each job also reports its own phases: ``started_at`` (launched), the attempt loop's exec (from the
probe's ``/proc`` start time), ``attempts/1.json`` ``started_at`` (the attempt loop starting torchrun).

(b) The built-in trainer, digits + mlp, 2 ranks: ``POST`` → ``first_metric_at``, warm vs cold.

Warm and cold use two servers (``TORCHYARD_WARM_RANKS`` on / off) started once, the warm one
waited on until its pool is ready (``GET /resources``).
"""

import json
import os
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx

from bench.common import Row, percentile, run_baseline
from bench.orchestration import PROBE_DIR, _phase, _probe
from bench.server import REPO_ROOT, Server

RANKS = 2
TOKEN = "bench-startup-api-token-0123456789"
SCRIPT = """import time; T = time.time()
import os
with open(f"first-{os.environ.get('RANK', '0')}.txt", "w") as f:
    f.write(repr(T))
"""
WARM_READY_TIMEOUT_S = 120.0


def _ts(iso: str | None) -> float | None:
    return None if iso is None else datetime.fromisoformat(iso).replace(tzinfo=UTC).timestamp()


def _first(run_dir: Path) -> float:
    times = [float(p.read_text()) for p in run_dir.glob("first-*.txt")]
    if len(times) < 1:
        raise RuntimeError(f"no first statement recorded in {run_dir}")
    return max(times)


def _server_env(warm: bool, scripts: Path) -> dict[str, str]:
    path = os.pathsep.join([str(PROBE_DIR), str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])
    return {"PYTHONPATH": path, "TORCHYARD_BENCH_PROBE": "1",
            "TORCHYARD_SCRIPT_DIRS": str(scripts), "TORCHYARD_API_TOKENS": TOKEN,
            "TORCHYARD_WARM_RANKS": "true" if warm else "false"}


def _wait_warm(server: Server) -> None:
    deadline = time.monotonic() + WARM_READY_TIMEOUT_S
    headers = {"Authorization": f"Bearer {TOKEN}"}
    while time.monotonic() < deadline:
        warm = httpx.get(f"{server.url}/resources", headers=headers).json().get("warm") or {}
        if warm.get("state") == "ready" and warm.get("idle", 0) >= RANKS + 1:
            return
        time.sleep(0.2)
    raise RuntimeError("the warm pool did not become ready")


def _run_job(server: Server, spec: dict, until: str) -> dict[str, float]:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=server.url, timeout=30, headers=headers) as client:
        t0 = time.time()
        r = client.post("/jobs", json=spec)
        r.raise_for_status()
        job_id = r.json()["id"]
        while True:
            job = client.get(f"/jobs/{job_id}").json()
            if job["state"] in ("succeeded", "failed", "cancelled"):
                break
            time.sleep(0.1)
    if job["state"] != "succeeded":
        raise RuntimeError(f"job {job_id} {job['state']}: {job['reason']}")
    run_dir = server.home / "runs" / str(job_id)
    out = {"started_at": (_ts(job["started_at"]) or 0) - t0}
    events = _probe(run_dir)
    loop = _phase(events, "attempt loop", "exec")
    if loop is not None:
        out["attempt loop exec'd"] = loop - t0
    attempt = json.loads((run_dir / "attempts" / "1.json").read_text())
    out["attempt loop started torchrun"] = attempt["started_at"] - t0
    # The process the attempt loop starts: torchrun's agent (cold) or the relay in front of it (warm).
    agent = [e["t"] for e in events if e["role"] in ("agent", "relay") and e["event"] == "exec"]
    if agent:
        out["torchrun exec'd"] = min(agent) - t0
    if until == "first":
        out["first statement"] = _first(run_dir) - t0
    else:
        out["first metric"] = (_ts(job["first_metric_at"]) or float("nan")) - t0
    return out


def _run_plain(workdir: Path, script: Path, torchrun: bool) -> float:
    run_dir = workdir / f"plain-{time.time_ns()}"
    run_dir.mkdir()
    argv = ([sys.executable, "-m", "torch.distributed.run", "--standalone",
             f"--nproc-per-node={RANKS}", str(script)] if torchrun
            else [sys.executable, str(script)])
    t0, _ = run_baseline(argv, run_dir, {**os.environ, "OMP_NUM_THREADS": "1"})
    return _first(run_dir) - t0


def _summary(bench: str, label: str, values: list[float], goal: str = "") -> list[Row]:
    return [Row(bench, f"{label} (median)", statistics.median(values), "s", goal,
                f"min {min(values):.3f}, p90 {percentile(values, 90):.3f}, n={len(values)}")]


def run(smoke: bool) -> list[Row]:
    repeats = 1 if smoke else 7
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="bench-start-") as tmp:
        workdir = Path(tmp)
        scripts = workdir / "scripts"
        scripts.mkdir()
        script = scripts / "first.py"
        script.write_text(SCRIPT)
        trivial = {"entrypoint": "first.py", "nproc_per_node": RANKS}
        trainer = {"name": "bench-start", "model": "mlp", "dataset": "digits", "epochs": 1,
                   "nproc_per_node": RANKS, "checkpoint_every": 0, "seed": 0}
        results: dict[str, list[dict[str, float]]] = {
            "warm": [], "cold": [], "warm trainer": [], "cold trainer": []}
        plain: dict[str, list[float]] = {"torchrun --standalone": [], "python script.py": []}
        with (Server.start(workdir / "warm", env=_server_env(True, scripts)) as warm,
              Server.start(workdir / "cold", env=_server_env(False, scripts)) as cold):
            _wait_warm(warm)
            _run_plain(workdir, script, torchrun=True)  # OS caches warm for every side
            for _ in range(repeats):
                results["warm"].append(_run_job(warm, trivial, "first"))
                _wait_warm(warm)  # the pool refills in the background; measure it full
                results["cold"].append(_run_job(cold, trivial, "first"))
                plain["torchrun --standalone"].append(_run_plain(workdir, script, True))
                plain["python script.py"].append(_run_plain(workdir, script, False))
            for _ in range(max(1, repeats // 2)):
                _wait_warm(warm)
                results["warm trainer"].append(_run_job(warm, trainer, "metric"))
                results["cold trainer"].append(_run_job(cold, trainer, "metric"))
    what = f"trivial script, {RANKS} ranks; alternating runs"
    for side in ("warm", "cold"):
        first = [r["first statement"] for r in results[side]]
        goal = "<= 0.5, ahead of plain torchrun" if side == "warm" else ""
        rows += _summary("startup", f"torchyard {side}: POST -> first statement", first, goal)
    for label, values in plain.items():
        rows += _summary("startup", f"plain {label}: Popen -> first statement", values)
    for side in ("warm", "cold"):
        runs = results[side]
        for phase in ("started_at", "attempt loop exec'd", "attempt loop started torchrun", "torchrun exec'd"):
            values = [r[phase] for r in runs if phase in r]
            if values:
                rows.append(Row("startup", f"torchyard {side} phase: {phase}",
                                statistics.median(values), "s after POST", "", what))
        gaps = [r["torchrun exec'd"] - r["started_at"] for r in runs]
        rows.append(Row("startup", f"torchyard {side}: started_at -> torchrun exec'd",
                        statistics.median(gaps), "s", "<= 0.1",
                        f"max {max(gaps):.3f}; started_at is stored with ms resolution"))
    for side in ("warm", "cold"):
        rows += _summary("startup", f"trainer digits+mlp {side}: POST -> first metric",
                         [r["first metric"] for r in results[f"{side} trainer"]])
    return rows


if __name__ == "__main__":
    for row in run("--smoke" in sys.argv):
        print(row)
