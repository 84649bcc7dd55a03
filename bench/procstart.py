"""The CPU of what torchyard starts over and over — warm servers, cold torchrun agents, HTTP
clients in ranks — each beside the way it was done before, in one run, alternating.

CPU seconds of a child process (user + system, ``RUSAGE_CHILDREN``), medians over rounds:

* the warm server's preload (the default ``TORCHYARD_WARM_PRELOAD``), as the server runs it
  (``service.run.warm.preload.preload``: the garbage collector off meanwhile) and as plain imports
  with the collector on, each ended by ``os._exit`` as the server ends;
* a cold torchrun agent from start to exit (``torch.distributed.run --help``: its imports and
  argument parsing), through ``service.run.fastexit`` and plain, which tears torch down at exit;
* a ``torchyard serve`` (SQLite, no warm pool) from its start to an answered ``/healthz`` and a
  drained SIGTERM, as shipped (the cyclic collector off until the app has started) and with
  ``gc.disable`` made a no-op, so the collector runs throughout as it did before;
* a ``torchyard serve`` (warm ranks on) from its start until its warm pool is ready, then
  SIGTERM: with a warm server of its own (the server's CPU and the warm server's, read before it
  drains) and with ``TORCHYARD_WARM_DIR`` naming the directory of another server's, already
  running (the server's CPU alone: it imports no torch);
* a job's attempt loop (``python -m service.run.attemptloop``, spare or not): its imports as shipped
  (retry rules at the first failure, attempt-file schemas at the first read) and eager, as
  before;
* beside them, a bare interpreter (``python -c pass``): the floor of any process start.

And in this process: an ``httpx.Client`` built with the default TLS context (certifi's CA bundle
loaded per client, as every rank's reporter did) against one for a plain-http URL (what the
reporter does now), per client.
"""

import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import psutil

from bench.common import Row
from bench.server import REPO_ROOT, Server
from service.executor.warmpool import ask, socket_path
from service.settings import Settings

# ``python -m service`` with the collector left on: gc.disable() does nothing.
COLLECTOR_ON = ("-c", "import gc, runpy; gc.disable = lambda: None; "
                "runpy.run_module('service', run_name='__main__', alter_sys=True)")


def child_cpu(argv: list[str]) -> float:
    """CPU seconds (user + system) of running ``argv`` to its end."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(argv, cwd=REPO_ROOT, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def server_cpu(home: Path, program: tuple[str, ...]) -> float:
    """CPU seconds (user + system) of one ``torchyard serve`` on ``home`` (a new SQLite store),
    from its start to an answered ``/healthz``, then SIGTERM and its exit."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    Server.start(home, env={"TORCHYARD_WARM_RANKS": "false"}, program=program).stop()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def warm_start_cpu(home: Path, warm_dir: Path) -> float:
    """CPU seconds of one ``torchyard serve`` naming ``warm_dir``, from its start until its pool
    reports ``ready``, then SIGTERM and its exit; plus the warm server's and its idle children's
    when this server started it (read before it drains)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    server = Server.start(home, env={"TORCHYARD_WARM_RANKS": "true",
                                     "TORCHYARD_WARM_DIR": str(warm_dir)})
    warm_cpu = 0.0
    try:
        deadline = time.monotonic() + 300
        while (httpx.get(f"{server.url}/resources", timeout=5).json()["warm"] or {}).get(
                "state") != "ready":
            if time.monotonic() > deadline:
                raise RuntimeError("the warm pool did not get ready")
            time.sleep(0.05)
        status = ask(socket_path(home, warm_dir), {"op": "status"}) or {}
        warm = psutil.Process(int(status["pid"]))
        if warm.ppid() == server.proc.pid:  # its own: count it and its idle children
            for proc in (warm, *warm.children()):
                times = proc.cpu_times()
                warm_cpu += times.user + times.system
    finally:
        server.stop()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime) + warm_cpu


def per_client_ms(make: Callable[[], httpx.Client], n: int) -> float:
    started = time.process_time()
    for _ in range(n):
        make().close()
    return (time.process_time() - started) / n * 1000


def run(smoke: bool) -> list[Row]:
    rounds, clients = (1, 5) if smoke else (5, 50)
    modules = Settings.model_fields["warm_preload"].default
    py = sys.executable
    cases = {
        "bare": [py, "-c", "pass"],
        # Both end with os._exit, as the warm server does (no teardown): the preload alone.
        "preload": [py, "-c", "import os; from service.run.warm.preload import preload; "
                    f"preload({modules!r}); os._exit(0)"],
        "plain imports": [py, "-c", f"import os, {', '.join(modules)}; os._exit(0)"],
        "agent, fastexit": [py, "-m", "service.run.fastexit", "-m", "torch.distributed.run",
                            "--help"],
        "agent, plain": [py, "-m", "torch.distributed.run", "--help"],
        "attempt loop, as shipped": [py, "-c", "import service.run.attemptloop"],
        # As before: the retry rules imported with the loop, the attempt models built at import.
        "attempt loop, eager": [py, "-c", "import service.run.attemptloop, service.run.retrydecision; "
                        "from torchyard_contract import runfiles as r; "
                        "[m.model_rebuild(force=True) for m in (r.AttemptFile, r.Outcome)]"],
    }
    cpu: dict[str, list[float]] = {name: [] for name in cases}
    servers = {"server, as shipped": ("-m", "service"), "server, collector on": COLLECTOR_ON}
    cpu.update({name: [] for name in servers})
    with tempfile.TemporaryDirectory(prefix="torchyard-procstart-") as tmp:
        for i in range(rounds):  # alternating: load on the host falls on every case alike
            for name, argv in cases.items():
                cpu[name].append(child_cpu(argv))
            for j, (name, program) in enumerate(servers.items()):
                cpu[name].append(server_cpu(Path(tmp) / f"server-{i}-{j}", program))
        # A server whose warm server the "shared" starts use (not measured itself).
        shared_dir = Path(tmp) / "shared-warm"
        cpu["warm, own"], cpu["warm, shared"] = [], []
        with Server.start(Path(tmp) / "first", env={"TORCHYARD_WARM_RANKS": "true",
                                                     "TORCHYARD_WARM_DIR": str(shared_dir)}):
            for i in range(rounds):
                cpu["warm, own"].append(
                    warm_start_cpu(Path(tmp) / f"own-{i}", Path(tmp) / f"own-{i}" / "warm"))
                cpu["warm, shared"].append(warm_start_cpu(Path(tmp) / f"shared-{i}", shared_dir))
    med = {name: statistics.median(values) for name, values in cpu.items()}
    default_tls = per_client_ms(httpx.Client, clients)
    plain_http = per_client_ms(lambda: httpx.Client(verify=False), clients)
    note = f"median of {rounds}; CPU s of the child, user + system"
    return [
        Row("procstart", "warm preload: CPU, as served / plain imports",
            round(med["preload"] / med["plain imports"], 3), "x", "< 1",
            f"{med['preload']:.2f} vs {med['plain imports']:.2f} CPU s; {note}"),
        Row("procstart", "cold torchrun agent: CPU, fastexit / plain",
            round(med["agent, fastexit"] / med["agent, plain"], 3), "x", "< 1",
            f"{med['agent, fastexit']:.2f} vs {med['agent, plain']:.2f} CPU s; {note}"),
        Row("procstart", "a job's attempt loop, its imports: CPU, as shipped / eager",
            round(med["attempt loop, as shipped"] / med["attempt loop, eager"], 3), "x", "< 1",
            f"{med['attempt loop, as shipped']:.2f} vs {med['attempt loop, eager']:.2f} CPU s (eager: the retry "
            f"rules and the attempt models' schemas at import, as before); {note}"),
        Row("procstart", "torchyard serve start: CPU, as shipped / collector on",
            round(med["server, as shipped"] / med["server, collector on"], 3), "x", "< 1",
            f"{med['server, as shipped']:.2f} vs {med['server, collector on']:.2f} CPU s, start "
            f"to /healthz and SIGTERM; {note}"),
        Row("procstart", "server start to a ready warm pool: CPU, shared warm server / own",
            round(med["warm, shared"] / med["warm, own"], 3), "x", "< 1",
            f"{med['warm, shared']:.2f} vs {med['warm, own']:.2f} CPU s (own: with the warm "
            f"server it started); {note}"),
        Row("procstart", "bare interpreter start", round(med["bare"], 3), "CPU s", "",
            "the floor of every process above"),
        Row("procstart", "httpx client: plain-http / default TLS context",
            round(plain_http / default_tls, 4), "x", "",
            f"{plain_http:.2f} vs {default_tls:.1f} ms of CPU per client, {clients} clients"),
    ]
