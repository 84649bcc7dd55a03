"""Scheduling at scale (issue 4): 10,000 queued jobs.

* ``POST /jobs`` latency while the queue fills to 10,000 (4 concurrent clients), against a live
  server run without its supervisor loop (``bench.server``) so every job stays queued.
* One scheduling pass over the full queue: ``Supervisor._schedule`` (read the queue, plan,
  record waiting reasons; nothing fits because a blocker job holds every CPU slot), and the pure
  ``service.domain.queue.scheduler.plan`` on its own.
* ``GET /jobs`` page latency (50 per page): the newest page, ``state=queued``, and a page from
  the middle by cursor.
"""

import statistics
import tempfile
import threading
import time
from pathlib import Path

import httpx

from bench.common import Row, percentile
from bench.server import Server, db_path, migrate

CPU_SLOTS = 4
CLIENTS = 4
SPEC = {"name": "queued", "model": "mlp", "dataset": "digits", "epochs": 1, "nproc_per_node": 1}


def fill_queue(server: Server, jobs: int) -> list[float]:
    """POST ``jobs`` jobs from ``CLIENTS`` threads; every answer must be 201. Latencies (s)."""
    latencies: list[float] = []
    lock = threading.Lock()
    failures: list[str] = []

    def client(n: int) -> None:
        with httpx.Client(base_url=server.url, timeout=60) as c:
            for i in range(n):
                spec = {**SPEC, "labels": {"team": f"t{i % 10}"}}
                t0 = time.perf_counter()
                r = c.post("/jobs", json=spec)
                dt = time.perf_counter() - t0
                with lock:
                    latencies.append(dt)
                    if r.status_code != 201:
                        failures.append(r.text)

    per = [jobs // CLIENTS + (1 if k < jobs % CLIENTS else 0) for k in range(CLIENTS)]
    threads = [threading.Thread(target=client, args=(n,)) for n in per]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures[:3]
    return latencies


def page_latencies(server: Server, params: dict[str, object], requests: int) -> list[float]:
    out = []
    with httpx.Client(base_url=server.url, timeout=30) as c:
        for _ in range(requests):
            t0 = time.perf_counter()
            r = c.get("/jobs", params=params)
            out.append(time.perf_counter() - t0)
            assert r.status_code == 200 and r.json()["items"], r.text[:300]
    return out


def scheduling_pass(home: Path, repeats: int) -> tuple[float, float, int]:
    """(median s of a full supervisor pass, median s of ``scheduler.plan`` alone, jobs waiting)."""
    from service.domain.loop.supervisor import Supervisor
    from service.domain.queue import scheduler
    from service.domain.queue.inventory import make_inventory
    from service.executor.local import LocalExecutor
    from service.settings import Settings
    from service.store import repository as repo
    from service.store.db import make_engine, make_session_factory
    from torchyard_contract.spec import JobSpec
    from torchyard_contract.state import JobState

    engine = make_engine(f"sqlite:///{db_path(home)}")
    factory = make_session_factory(engine)
    read_engine = make_engine(f"sqlite:///{db_path(home)}", readonly=True)
    inventory = make_inventory("none", CPU_SLOTS)
    with factory() as session:  # a running job holds every slot, so the pass launches nothing
        blocker = repo.create_job(session, JobSpec(name="blocker", nproc_per_node=CPU_SLOTS))
        repo.transition(session, blocker.id, JobState.starting, started_at=repo.utcnow())
        repo.allocate(session, blocker.id, inventory.resource_names("cpu"))
        session.commit()
    supervisor = Supervisor(
        settings=Settings(home=home, gpus="none", cpu_slots=CPU_SLOTS),
        session_factory=factory, read_session_factory=make_session_factory(read_engine),
        inventory=inventory, executor=LocalExecutor(),
    )
    passes = []
    try:
        for _ in range(repeats):
            supervisor._queue_dirty = True
            t0 = time.perf_counter()
            supervisor._schedule()
            passes.append(time.perf_counter() - t0)
        waiting = len(supervisor._waiting)
        with factory() as session:
            queue = [
                scheduler.QueuedJob(job_id, priority, scheduler.CPU, count, max_runtime_s)
                for job_id, priority, _device, count, max_runtime_s, _team, _preemptible
                in repo.queued_for_scheduling(session)
            ]
    finally:
        engine.dispose()
        read_engine.dispose()
    plans = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        scheduler.plan(queue, {scheduler.CPU: []}, [], time.time())
        plans.append(time.perf_counter() - t0)
    return statistics.median(passes), statistics.median(plans), waiting


def run(smoke: bool) -> list[Row]:
    jobs = 200 if smoke else 10_000
    requests = 20 if smoke else 300
    repeats = 2 if smoke else 5
    with tempfile.TemporaryDirectory(prefix="bench-sched-") as tmp:
        home = Path(tmp)
        migrate(home)
        env = {"TORCHYARD_CPU_SLOTS": str(CPU_SLOTS)}
        with Server.start(home, supervisor=False, env=env) as server:
            t0 = time.perf_counter()
            posts = fill_queue(server, jobs)
            fill_s = time.perf_counter() - t0
            newest = page_latencies(server, {"limit": 50}, requests)
            queued = page_latencies(server, {"limit": 50, "state": "queued"}, requests)
            middle = page_latencies(server, {"limit": 50, "before": jobs // 2}, requests)
            labelled = page_latencies(server, {"limit": 50, "label": "team=t3"}, requests)
        pass_s, plan_s, waiting = scheduling_pass(home, repeats)
    assert waiting == jobs, f"expected {jobs} waiting jobs, got {waiting}"
    label = f"{jobs:,} queued jobs"
    return [
        Row("scheduling", "POST /jobs p50", percentile(posts, 50) * 1000, "ms", "",
            f"{CLIENTS} clients filling the queue to {jobs:,}: {jobs / fill_s:.0f} jobs/s"),
        Row("scheduling", "POST /jobs p99", percentile(posts, 99) * 1000, "ms"),
        Row("scheduling", "one scheduling pass (supervisor)", pass_s * 1000, "ms", "",
            f"{label}: read queue + plan + reasons; median of {repeats}"),
        Row("scheduling", "scheduler.plan alone", plan_s * 1000, "ms", "", label),
        Row("scheduling", "GET /jobs newest page p99", percentile(newest, 99) * 1000, "ms", "",
            f"limit 50, {requests} requests, {label}"),
        Row("scheduling", "GET /jobs?state=queued page p99", percentile(queued, 99) * 1000, "ms"),
        Row("scheduling", "GET /jobs?before=<middle> page p99", percentile(middle, 99) * 1000,
            "ms"),
        Row("scheduling", "GET /jobs?label=team=t3 page p99", percentile(labelled, 99) * 1000,
            "ms"),
    ]


if __name__ == "__main__":
    import sys

    for row in run("--smoke" in sys.argv):
        print(row)
