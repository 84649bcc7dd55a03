"""The whole round trip of a short job, and where its end goes: default settings, side by side.

(a) A trivial script, 1 and 2 ranks, whose first statement records ``time.time()`` into
``first-<RANK>.txt`` and whose last one into ``last-<RANK>.txt``: ``POST /jobs`` → every rank's
first statement and ``POST`` → the client sees ``succeeded`` (``GET /jobs/{id}/wait``) for a
torchyard script job with the default settings (warm ranks on) and with warm ranks off, against
plain ``torchrun --standalone`` run the same way (``Popen`` → first statement, → exit), and
against Ray Jobs (``submit_job`` → first statement, → ``SUCCEEDED`` seen) when ``ray`` is
installed (the ``bench`` extra does not pull it: it is large). Runs alternate, so load changes
hit all of them.

The end path of each torchyard job, from the script's last statement: the torchrun agent's exit
(the probe's ``atexit``), the attempt loop's attempt record closed (``attempts/1.json`` ``ended_at``),
its outcome written (``exit.json`` ``ended_at``), the job terminal in the database
(``ended_at``) and the client's ``/wait`` answered.

(b) The 2-rank DDP seed script (``examples/ddp_seed.py`` when present, else a built-in one):
job wall (``POST`` → ``succeeded``) / plain ``torchrun`` wall, alternating.

(c) The warm pool's memory (PSS and USS over all its processes, from ``/proc/PID/smaps_rollup``)
and the server's idle CPU (server, pool and warm server, over ``IDLE_S``), default settings.
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

from bench.common import Row, percentile, run_baseline
from bench.orchestration import PROBE_DIR, _probe
from bench.server import REPO_ROOT, Server

TOKEN = "bench-endpath-api-token-0123456789"
SCRIPT = """import time; T = time.time()
import os
R = os.environ.get("RANK", "0")
with open(f"first-{R}.txt", "w") as f:
    f.write(repr(T))
print(f"rank {R}: last line", flush=True)
with open(f"last-{R}.txt", "w") as f:
    f.write(repr(time.time()))
"""
DDP_SEED = """import os, torch, torch.distributed as dist
dist.init_process_group("gloo")
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(256, 64), torch.randn(256, 1)
for _ in range(200):
    opt.zero_grad(); torch.nn.functional.mse_loss(model(x), y).backward(); opt.step()
dist.barrier()  # neither rank tears gloo down while the other still talks to it
dist.destroy_process_group()
"""
WARM_READY_TIMEOUT_S = 180.0
IDLE_S = 10.0
TERMINAL = ("succeeded", "failed", "cancelled")


def _ts(iso: str | None) -> float | None:
    return None if iso is None else datetime.fromisoformat(iso).replace(tzinfo=UTC).timestamp()


def _stamp(run_dir: Path, kind: str) -> float:
    times = [float(p.read_text()) for p in run_dir.glob(f"{kind}-*.txt")]
    if not times:
        raise RuntimeError(f"no {kind} statement recorded in {run_dir}")
    return max(times)


def _server_env(scripts: Path, warm: bool | None) -> dict[str, str]:
    path = os.pathsep.join([str(PROBE_DIR), str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])
    env = {"PYTHONPATH": path, "TORCHYARD_BENCH_PROBE": "1",
           "TORCHYARD_SCRIPT_DIRS": str(scripts), "TORCHYARD_API_TOKENS": TOKEN}
    # None: the default (on); said explicitly, or a caller's environment (the test suite sets
    # it false) would decide.
    env["TORCHYARD_WARM_RANKS"] = "false" if warm is False else "true"
    return env


def _headers() -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKEN}"}


def warm_status(server: Server) -> dict:
    return httpx.get(f"{server.url}/resources", headers=_headers()).json().get("warm") or {}


def wait_warm(server: Server, idle: int) -> dict:
    deadline = time.monotonic() + WARM_READY_TIMEOUT_S
    while time.monotonic() < deadline:
        warm = warm_status(server)
        if warm.get("state") == "ready" and warm.get("idle", 0) >= idle:
            return warm
        time.sleep(0.2)
    raise RuntimeError(f"the warm pool did not become ready: {warm_status(server)}")


def run_job(server: Server, spec: dict) -> dict[str, float]:
    """One job, POST → /wait answered; its phases in seconds after POST."""
    with httpx.Client(base_url=server.url, timeout=60, headers=_headers()) as client:
        t0 = time.time()
        r = client.post("/jobs", json=spec)
        r.raise_for_status()
        job_id = r.json()["id"]
        while True:
            job = client.get(f"/jobs/{job_id}/wait", params={"timeout": 30}).json()
            if job["state"] in TERMINAL:
                break
        t_end = time.time()
    if job["state"] != "succeeded":
        raise RuntimeError(f"job {job_id} {job['state']}: {job['reason']}")
    run_dir = server.home / "runs" / str(job_id)
    out = {"client sees succeeded": t_end - t0, "job ended_at": (_ts(job["ended_at"]) or 0) - t0}
    if any(run_dir.glob("first-*.txt")):
        out["first statement"] = _stamp(run_dir, "first") - t0
        out["last statement"] = _stamp(run_dir, "last") - t0
    agent = [e["t"] for e in _probe(run_dir) if e["role"] == "agent" and e["event"] == "exit"]
    if agent:
        out["agent exit"] = max(agent) - t0
    attempt = json.loads((run_dir / "attempts" / "1.json").read_text())
    out["attempt closed"] = attempt["ended_at"] - t0
    out["outcome written"] = json.loads(run_dir.joinpath("exit.json").read_text())["ended_at"] - t0
    return out


def run_plain(workdir: Path, script: Path, ranks: int) -> dict[str, float]:
    run_dir = workdir / f"plain-{time.time_ns()}"
    run_dir.mkdir()
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={ranks}", str(script)]
    t0, t_end = run_baseline(argv, run_dir, {**os.environ, "OMP_NUM_THREADS": "1"})
    out = {"client sees succeeded": t_end - t0}
    if any(run_dir.glob("first-*.txt")):
        out["first statement"] = _stamp(run_dir, "first") - t0
    return out


def run_ray(client: object, workdir: Path, script: Path) -> dict[str, float]:  # pragma: no cover
    run_dir = workdir / f"ray-{time.time_ns()}"
    run_dir.mkdir()
    (run_dir / script.name).write_text(script.read_text())
    t0 = time.time()
    job = client.submit_job(entrypoint=f"python {script.name}",  # type: ignore[attr-defined]
                            runtime_env={"working_dir": str(run_dir)})
    while str(client.get_job_status(job)) not in ("SUCCEEDED", "JobStatus.SUCCEEDED",  # type: ignore[attr-defined]
                                                  "FAILED", "JobStatus.FAILED"):
        time.sleep(0.02)
    return {"client sees succeeded": time.time() - t0}


def _ray_client() -> object | None:
    try:
        from ray.job_submission import JobSubmissionClient  # type: ignore[import-not-found]
    except ImportError:
        return None
    return JobSubmissionClient("http://127.0.0.1:8265")  # pragma: no cover


def pool_pids(server: Server) -> list[int]:
    """The warm server and every process below it (its idle children)."""
    from service.executor.warmpool import ask, socket_path

    pid = (ask(socket_path(server.home), {"op": "status"}) or {}).get("pid")
    if not pid:
        return []
    try:
        proc = psutil.Process(int(pid))
        return [proc.pid, *(p.pid for p in proc.children(recursive=True))]
    except psutil.Error:
        return []


def memory(pids: list[int]) -> tuple[int, int]:
    """(PSS, USS) in bytes summed over ``pids``, from ``/proc/PID/smaps_rollup``."""
    pss = uss = 0
    for pid in pids:
        try:
            text = Path(f"/proc/{pid}/smaps_rollup").read_text()
        except OSError:
            continue
        fields = {line.split(":")[0]: int(line.split()[1]) * 1024
                  for line in text.splitlines()[1:] if line.split()[-1:] == ["kB"]}
        pss += fields.get("Pss", 0)
        uss += fields.get("Private_Clean", 0) + fields.get("Private_Dirty", 0)
    return pss, uss


def cpu_seconds(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
            total += t.user + t.system
        except psutil.Error:
            continue
    return total


def _summary(label: str, values: list[float], goal: str = "", unit: str = "s") -> Row:
    return Row("endpath", f"{label} (median)", statistics.median(values), unit, goal,
               f"min {min(values):.3f}, p90 {percentile(values, 90):.3f}, n={len(values)}")


PHASES = ("last statement", "attempt closed", "outcome written", "job ended_at",
          "client sees succeeded")


def run(smoke: bool) -> list[Row]:
    repeats = 1 if smoke else 5
    rows: list[Row] = []
    ray = _ray_client()
    with tempfile.TemporaryDirectory(prefix="bench-end-") as tmp:
        workdir = Path(tmp)
        scripts = workdir / "scripts"
        scripts.mkdir()
        script = scripts / "trivial.py"
        script.write_text(SCRIPT)
        ddp = scripts / "ddp_seed.py"
        ddp.write_text(DDP_SEED)
        sides: dict[str, dict[str, list[dict[str, float]]]] = {}
        with (Server.start(workdir / "default", env=_server_env(scripts, None)) as default,
              Server.start(workdir / "cold", env=_server_env(scripts, False)) as cold):
            boot = wait_warm(default, 1)
            pids = pool_pids(default)
            preload_cpu = cpu_seconds(pids)
            pss, uss = memory(pids)
            rows.append(Row("endpath", "warm pool at rest: PSS, all its processes", pss / 2**20,
                            "MiB", "<= 400 MB", f"{len(pids)} processes; /resources says "
                            f"{boot.get('memory_bytes', 0) / 2**20:.0f} MiB"))
            rows.append(Row("endpath", "warm pool at rest: USS, all its processes", uss / 2**20,
                            "MiB", "", ""))
            rows.append(Row("endpath", "warm server preload: CPU seconds", preload_cpu, "s", "",
                            "what a server started with the defaults costs once"))
            server_proc = psutil.Process(default.proc.pid)
            every = [server_proc, *server_proc.children(recursive=True)]
            idle_pids = sorted({p.pid for p in every} | set(pids))
            before = cpu_seconds(idle_pids)
            time.sleep(2 if smoke else IDLE_S)
            idle = (cpu_seconds(idle_pids) - before) / (2 if smoke else IDLE_S)
            rows.append(Row("endpath", "idle CPU: server + warm pool, default settings",
                            idle * 100, "% of a core", "", f"{len(idle_pids)} processes"))
            run_plain(workdir, script, 1)  # OS caches warm for every side
            for ranks in (1, 2):
                spec = {"entrypoint": "trivial.py", "nproc_per_node": ranks}
                got = sides.setdefault(str(ranks), {"default": [], "cold": [], "torchrun": [],
                                                    "ray": []})
                for _ in range(repeats):
                    wait_warm(default, ranks + 1)
                    got["default"].append(run_job(default, spec))
                    got["cold"].append(run_job(cold, spec))
                    got["torchrun"].append(run_plain(workdir, script, ranks))
                    if ray is not None:  # pragma: no cover
                        got["ray"].append(run_ray(ray, workdir, script))
            ddp_runs: dict[str, list[float]] = {"default": [], "torchrun": []}
            ddp_spec = {"entrypoint": "ddp_seed.py", "nproc_per_node": 2}
            for _ in range(repeats):
                wait_warm(default, 3)
                ddp_runs["default"].append(run_job(default, ddp_spec)["client sees succeeded"])
                ddp_runs["torchrun"].append(run_plain(workdir, ddp, 2)["client sees succeeded"])
    for ranks, got in sides.items():
        plain_first = statistics.median(r["first statement"] for r in got["torchrun"])
        plain_end = statistics.median(r["client sees succeeded"] for r in got["torchrun"])
        ray_end = (statistics.median(r["client sees succeeded"] for r in got["ray"])
                   if got["ray"] else None)
        for side in ("default", "cold"):
            first = [r["first statement"] for r in got[side]]
            end = [r["client sees succeeded"] for r in got[side]]
            name = "torchyard default (warm)" if side == "default" else "torchyard warm off"
            rows.append(_summary(f"{ranks} rank(s), {name}: POST -> first statement", first,
                                 "<= 0.35x plain torchrun" if side == "default" else ""))
            rows.append(Row("endpath", f"{ranks} rank(s), {name}: first statement / plain "
                            "torchrun", statistics.median(first) / plain_first, "x",
                            "<= 0.35" if side == "default" else "", "medians"))
            ray_note = (f"{statistics.median(end) / ray_end:.2f}x Ray Jobs" if ray_end
                        else "Ray not installed: no Ray figure")
            rows.append(_summary(f"{ranks} rank(s), {name}: POST -> client sees succeeded",
                                 end, "<= 1.0 s, <= 0.5x Ray" if side == "default" else ""))
            rows.append(Row("endpath", f"{ranks} rank(s), {name}: succeeded / plain torchrun "
                            "exit", statistics.median(end) / plain_end, "x", "", ray_note))
            for a, b in zip(PHASES, PHASES[1:], strict=False):
                gaps = [r[b] - r[a] for r in got[side] if a in r and b in r]
                if gaps:
                    rows.append(Row("endpath", f"{ranks} rank(s), {name} end path: {a} -> {b}",
                                    statistics.median(gaps), "s", "",
                                    f"max {max(gaps):.3f}"))
        rows.append(_summary(f"{ranks} rank(s), plain torchrun --standalone: Popen -> first "
                             "statement", [r["first statement"] for r in got["torchrun"]]))
        rows.append(_summary(f"{ranks} rank(s), plain torchrun --standalone: Popen -> exit",
                             [r["client sees succeeded"] for r in got["torchrun"]]))
        if got["ray"]:  # pragma: no cover
            rows.append(_summary(f"{ranks} rank(s), Ray Jobs: submit -> SUCCEEDED seen",
                                 [r["client sees succeeded"] for r in got["ray"]]))
    ratios = [j / p for j, p in zip(ddp_runs["default"], ddp_runs["torchrun"], strict=True)]
    rows.append(Row("endpath", "2-rank DDP seed script: job wall / plain torchrun wall (median)",
                    statistics.median(ratios), "x", "<= 1.0",
                    f"min {min(ratios):.2f}, max {max(ratios):.2f}, n={len(ratios)}; job "
                    f"{statistics.median(ddp_runs['default']):.2f} s, torchrun "
                    f"{statistics.median(ddp_runs['torchrun']):.2f} s"))
    return rows


if __name__ == "__main__":
    for row in run("--smoke" in sys.argv):
        print(row)
