"""Orchestration overhead: one training run by plain ``torchrun`` and as a torchyard job.

Same rank program, spec, ranks and seed both ways: (a) ``python -m torch.distributed.run`` of
``python -m worker --spec spec.json`` with torchrun's defaults, timed from ``Popen`` to exit;
(b) ``POST /jobs`` to a live ``torchyard serve``, timed from the POST to the client seeing
``succeeded`` (``GET /jobs/<id>`` every ``CLIENT_POLL_S``). Runs alternate a, b, a, b, ...

Start-up phases come from the probe in ``bench/probe`` (a ``sitecustomize`` on ``PYTHONPATH`` in
both cases, so both pay its cost): when the attempt loop, the torchrun agent and the ranks were exec'd,
when each rank had torch imported, finished rendezvous, loaded data, built the model (``ready``)
and took its first step; plus the job's own recorded times. Each phase is the slowest rank's.
Goals: wall-time ratio b/a <= 1.03; start (to every rank's first step) within 0.25 s of (a).
(c) is (b) on a second server with warm ranks on (``TORCHYARD_WARM_RANKS``), waited on until its
pool is full before each run; the runs go a, b, c, a, b, c, ... and the warm ratio is reported
with its spread (each run's c / the a before it). Warm ranks run in the warm server's processes,
which the probe does not instrument: (c) has no rank phases.
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
import psutil

from bench.common import Row, run_baseline
from bench.server import REPO_ROOT, Server
from service.run.socketport import free_port

PROBE_DIR = Path(__file__).resolve().parent / "probe"
PROBE_FILE = "bench-probe.jsonl"
CLIENT_POLL_S = 0.1  # each GET costs the server CPU the ranks would otherwise get
RANKS = 2
RANK_EVENTS = ("exec", "torch_imported", "rendezvous_done", "data_loaded", "ready", "first_step")


def _spec(epochs: int) -> dict[str, object]:
    return {"name": "bench-orch", "model": "mlp", "dataset": "digits", "epochs": epochs,
            "nproc_per_node": RANKS, "checkpoint_every": 0, "seed": 0}


def _env(**extra: str) -> dict[str, str]:
    path = os.pathsep.join([str(PROBE_DIR), str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path, "TORCHYARD_BENCH_PROBE": "1",
            "OMP_NUM_THREADS": "1", **extra}


def _probe(run_dir: Path) -> list[dict]:
    path = run_dir / PROBE_FILE
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _phase(events: list[dict], role: str, event: str) -> float | None:
    """The latest time ``event`` happened among processes of ``role`` (the slowest rank)."""
    times = [e["t"] for e in events if e["role"] == role and e["event"] == event]
    return max(times) if times else None


def _rank_phases(events: list[dict], t0: float) -> dict[str, float]:
    out = {}
    agent = _phase(events, "agent", "exec")
    if agent is not None:
        out["torchrun agent exec'd"] = agent - t0
    for event in RANK_EVENTS:
        t = _phase(events, "rank", event)
        if t is not None:
            out[f"ranks: {event}"] = t - t0
    return out


def run_plain(workdir: Path, epochs: int) -> dict[str, object]:
    run_dir = workdir / f"plain-{time.time_ns()}"
    run_dir.mkdir(parents=True)
    spec_file = run_dir / "spec.json"
    spec_file.write_text(json.dumps(_spec(epochs)))
    argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1",
            f"--nproc-per-node={RANKS}", "--master-addr=127.0.0.1",
            f"--master-port={free_port()}", "-m", "worker", "--spec", str(spec_file)]
    env = _env(TORCHYARD_RUN_DIR=str(run_dir))
    t0, t_end = run_baseline(argv, run_dir, env)
    events = _probe(run_dir)
    phases = _rank_phases(events, t0)
    exits = [e["t"] for e in events if e["role"] == "rank" and e["event"] == "exit"]
    if exits:
        phases["ranks: exit"] = max(exits) - t0
    return {"wall": t_end - t0, "start": phases.get("ranks: first_step", float("nan")),
            "phases": phases}


def _ts(iso: str | None) -> float | None:
    return None if iso is None else datetime.fromisoformat(iso).replace(tzinfo=UTC).timestamp()


def run_job(server: Server, epochs: int) -> dict[str, object]:
    server_proc = psutil.Process(server.proc.pid)
    cpu0 = sum(server_proc.cpu_times()[:2])
    with httpx.Client(base_url=server.url, timeout=30) as client:
        t0 = time.time()
        r = client.post("/jobs", json=_spec(epochs))
        t_posted = time.time()
        r.raise_for_status()
        job_id = r.json()["id"]
        while True:
            job = client.get(f"/jobs/{job_id}").json()
            if job["state"] in ("succeeded", "failed", "cancelled"):
                t_end = time.time()
                break
            time.sleep(CLIENT_POLL_S)
    server_cpu = sum(server_proc.cpu_times()[:2]) - cpu0
    if job["state"] != "succeeded":
        raise RuntimeError(f"job {job_id} {job['state']}: {job['reason']}")
    run_dir = server.home / "runs" / str(job_id)
    events = _probe(run_dir)
    phases = {"POST answered": t_posted - t0}
    for label, key in (("job launched (started_at)", "started_at"),):
        t = _ts(job.get(key))
        if t is not None:
            phases[label] = t - t0
    loop = _phase(events, "attempt loop", "exec")
    if loop is not None:
        phases["attempt loop exec'd"] = loop - t0
    attempts = json.loads((run_dir / "attempts" / "1.json").read_text())
    phases["attempt loop started torchrun"] = attempts["started_at"] - t0
    phases.update(_rank_phases(events, t0))
    exits = [e["t"] for e in events if e["role"] == "rank" and e["event"] == "exit"]
    if exits:
        phases["ranks: exit"] = max(exits) - t0
    agent_exit = _phase(events, "agent", "exit")
    if agent_exit is not None:
        phases["torchrun agent exit"] = agent_exit - t0
    outcome = json.loads((run_dir / "exit.json").read_text())
    phases["attempt loop wrote exit.json"] = outcome["ended_at"] - t0
    ended = _ts(job.get("ended_at"))
    if ended is not None:
        phases["job ended (ended_at)"] = ended - t0
    phases["client saw succeeded"] = t_end - t0
    return {"wall": t_end - t0, "start": phases.get("ranks: first_step", float("nan")),
            "phases": phases, "server_cpu": server_cpu}


def _median_phases(runs: list[dict]) -> dict[str, float]:
    keys = list(dict.fromkeys(k for r in runs for k in r["phases"]))
    return {k: statistics.median(r["phases"][k] for r in runs if k in r["phases"]) for k in keys}


def _wait_warm(server: Server) -> None:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        warm = httpx.get(f"{server.url}/resources").json().get("warm") or {}
        if warm.get("state") == "ready" and warm.get("idle", 0) >= RANKS + 1:
            return
        time.sleep(0.2)
    raise RuntimeError("the warm pool did not become ready")


def run(smoke: bool) -> list[Row]:
    epochs, repeats = (1, 1) if smoke else (60, 5)
    plain: list[dict] = []
    jobs: list[dict] = []
    warm_jobs: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="bench-orch-") as tmp:
        workdir = Path(tmp)
        with (Server.start(workdir / "home", env=_env(TORCHYARD_WARM_RANKS="false")) as server,
              Server.start(workdir / "warm", env=_env(TORCHYARD_WARM_RANKS="true")) as warm):
            if not smoke:
                run_plain(workdir, 1)  # warm the OS caches (torch import) for both sides
            for _ in range(repeats):
                plain.append(run_plain(workdir, epochs))
                jobs.append(run_job(server, epochs))
                _wait_warm(warm)
                warm_jobs.append(run_job(warm, epochs))
    a_wall = statistics.median(r["wall"] for r in plain)
    b_wall = statistics.median(r["wall"] for r in jobs)
    a_start = statistics.median(r["start"] for r in plain)
    b_start = statistics.median(r["start"] for r in jobs)
    ratios = [w["wall"] / p["wall"] for w, p in zip(warm_jobs, plain, strict=True)]
    what = f"digits + mlp, {RANKS} ranks, {epochs} epochs, median of {repeats} alternating runs"
    rows = [
        Row("orchestration", "plain torchrun wall", a_wall, "s", "", what),
        Row("orchestration", "torchyard job wall (POST -> succeeded)", b_wall, "s"),
        Row("orchestration", "wall ratio job / plain", b_wall / a_wall, "x", "<= 1.03"),
        Row("orchestration", "warm-rank job wall (POST -> succeeded)",
            statistics.median(r["wall"] for r in warm_jobs), "s"),
        Row("orchestration", "wall ratio warm-rank job / plain", statistics.median(ratios), "x",
            "<= 1.03", f"per-run ratios: min {min(ratios):.3f}, max {max(ratios):.3f}, "
            f"n={len(ratios)}"),
        Row("orchestration", "plain: start -> every rank's first step", a_start, "s"),
        Row("orchestration", "job: POST -> every rank's first step", b_start, "s"),
        Row("orchestration", "start difference job - plain", b_start - a_start, "s", "<= 0.25"),
        Row("orchestration", "server CPU during the job", statistics.median(
            r["server_cpu"] for r in jobs), "cpu-s", "",
            "API, supervisor loop, record ingestion: competes with the ranks on 2 cores"),
    ]
    for side, runs in (("plain", plain), ("job", jobs), ("warm-rank job", warm_jobs)):
        for phase, t in _median_phases(runs).items():
            rows.append(Row("orchestration", f"{side} phase: {phase}", t, "s after start"))
    return rows


if __name__ == "__main__":
    for row in run("--smoke" in sys.argv):
        print(row)
