"""Metric ingestion: records/s through the real HTTP path (live ``torchyard serve``).

N writer threads each POST pre-encoded batches to ``/jobs/<id>/records`` with the job's token,
as ranks do (one request = one batch = one writer transaction). Every record is new (distinct
natural key), so every one is validated, inserted and indexed. Goal: >= 50,000 records/s.
"""

import json
import tempfile
import threading
import time
from pathlib import Path

import httpx
import psutil

from bench.common import Row, percentile
from bench.server import BENCH_RANKS, Server, insert_running_job, migrate

GOAL = ">= 50,000 records/s (2 cores)"


def _bodies(writer: int, batches: int, batch_size: int) -> list[bytes]:
    now = time.time()
    out = []
    for b in range(batches):
        records = [
            {
                "attempt": 1,
                "rank": writer,
                "epoch": b,
                "step": i,
                "name": "loss",
                "value": 0.5 + i * 1e-6,
                "time": now,
            }
            for i in range(batch_size)
        ]
        out.append(json.dumps({"records": records}).encode())
    return out


def measure(server: Server, job_id: int, token: str, writers: int, batches: int,
            batch_size: int, first_rank: int = 0) -> dict[str, float]:
    """Post ``batches`` batches from each of ``writers`` threads; records/s and request latency."""
    bodies = [_bodies(first_rank + w, batches, batch_size) for w in range(writers)]
    latencies: list[float] = []
    accepted = [0] * writers
    errors = [0] * writers
    lock = threading.Lock()
    start_gate = threading.Barrier(writers + 1)

    def write(w: int) -> None:
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        with httpx.Client(base_url=server.url, timeout=60, headers=headers) as client:
            start_gate.wait()
            for body in bodies[w]:
                t0 = time.perf_counter()
                r = client.post(f"/jobs/{job_id}/records", content=body)
                dt = time.perf_counter() - t0
                with lock:
                    latencies.append(dt)
                if r.status_code == 200:
                    accepted[w] += r.json()["accepted"]
                else:
                    errors[w] += 1

    threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
    for t in threads:
        t.start()
    procs = server_processes(server)
    start_gate.wait()
    cpu0 = server_cpu(procs)
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    used_cpu = server_cpu(procs) - cpu0
    total = sum(accepted)
    return {
        "records": total,
        "expected": writers * batches * batch_size,
        "errors": sum(errors),
        "wall_s": wall,
        "records_per_s": total / wall,
        "server_cpu_s": used_cpu,
        "records_per_server_cpu_s": total / used_cpu if used_cpu > 0 else float("nan"),
        "p50_ms": percentile(latencies, 50) * 1000,
        "p99_ms": percentile(latencies, 99) * 1000,
    }


def server_processes(server: Server) -> list[psutil.Process]:
    """The server and its worker processes (``--workers``), if any."""
    procs = [psutil.Process(server.proc.pid)]
    return procs + procs[0].children(recursive=True)


def server_cpu(procs: list[psutil.Process]) -> float:
    """User + system CPU-seconds of ``procs`` so far."""
    total = 0.0
    for proc in procs:
        try:
            total += sum(proc.cpu_times()[:2])
        except psutil.Error:
            pass
    return total


def run(smoke: bool) -> list[Row]:
    writers, batch_size = 4, 1000
    batches = 2 if smoke else 50
    with tempfile.TemporaryDirectory(prefix="bench-ingest-") as tmp:
        home = Path(tmp)
        migrate(home)
        job_id, token = insert_running_job(home)
        with Server.start(home, supervisor=False) as server:
            # Warm-up: first requests pay imports and the statement cache.
            measure(server, job_id, token, 1, 1, 10, first_rank=BENCH_RANKS - 1)
            m = measure(server, job_id, token, writers, batches, batch_size)
    assert m["errors"] == 0 and m["records"] == m["expected"], m
    note = f"{writers} writers x {batches} batches x {batch_size} records, {m['wall_s']:.1f} s"
    return [
        Row("ingest", "records/s", m["records_per_s"], "rec/s", GOAL, note),
        Row("ingest", "records per server CPU-second", m["records_per_server_cpu_s"], "rec/cpu-s",
            "", "load-independent: what one core does for the server; clients use the other"),
        Row("ingest", "POST p50 (1000-record batch)", m["p50_ms"], "ms"),
        Row("ingest", "POST p99 (1000-record batch)", m["p99_ms"], "ms"),
    ]


if __name__ == "__main__":
    import sys

    for row in run("--smoke" in sys.argv):
        print(row)
