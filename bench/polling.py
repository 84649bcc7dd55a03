"""Polling at scale: ``GET /jobs/<id>/metrics?after=`` as the table grows, and many pollers at once.

Sizes: the job's records are bulk-loaded through SQL (10k, 100k, 1M) while the real server runs.
At each size, one client polls sequentially: a caught-up poller (``after`` = 10 records before the
end) and a full page (1000 records from the middle). Then N pollers poll the tail every
``POLL_INTERVAL_S`` for ``duration`` while a writer posts 10-record batches every 0.1 s, and
the same pollers again with no pause (saturation). Requests go to 127.0.0.1 only, in bounded loops.
Goal: p99 <= 10 ms and flat as the table grows; concurrent: zero errors.
"""

import asyncio
import itertools
import json
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from bench.common import Row, percentile
from bench.loadgen import Connection
from bench.server import (
    BENCH_RANKS,
    Server,
    bulk_load_records,
    insert_running_job,
    max_seq,
    migrate,
)

GOAL = "p99 <= 10 ms, flat as the table grows"
POLL_INTERVAL_S = 0.5
REQUEST_TIMEOUT_S = 30.0
# A busy job: 100 records/s (e.g. 8 ranks x 12 step metrics/s); every poll reads what is new.
WRITER_BATCH = 10
WRITER_PERIOD_S = 0.1
# The writer's epochs, over every run in this process: each batch holds new records (a replay
# would be answered "duplicates" and give the pollers nothing to read). Epoch 0 is the warm-up's.
_WRITER_EPOCHS = itertools.count(1)


def sequential(server: Server, job_id: int, after: int, limit: int, requests: int) -> list[float]:
    """Latencies (s) of ``requests`` polls at one cursor; each must return 200 and its page."""
    url = f"/jobs/{job_id}/metrics"
    out = []
    with httpx.Client(base_url=server.url, timeout=30) as client:
        for _ in range(requests):
            t0 = time.perf_counter()
            r = client.get(url, params={"after": after, "limit": limit})
            out.append(time.perf_counter() - t0)
            assert r.status_code == 200, r.text
            assert r.json()["items"], "expected a non-empty page"
    return out


async def _concurrent(server: Server, job_id: int, token: str, pollers: int, duration_s: float,
                      interval_s: float, start_after: int, together: bool = False
                      ) -> dict[str, float]:
    """N pollers on their own keep-alive connections (``bench.loadgen``) and one writer.
    ``together``: every poller starts at the same instant instead of spread over the first
    interval."""
    latencies: list[float] = []
    errors = 0
    written = 0
    deadline = time.monotonic() + duration_s
    url = urlsplit(server.url)
    host, port = url.hostname or "127.0.0.1", url.port or 80

    async def poll(index: int) -> None:
        nonlocal errors
        after = start_after
        conn = Connection(host, port)
        if interval_s and not together:
            # Independent dashboards: each starts at its own moment within the first interval
            # (all 200 at the same instant would measure one burst, not polling).
            await asyncio.sleep(interval_s * index / pollers)
        try:
            while time.monotonic() < deadline:
                t0 = time.perf_counter()
                try:
                    status, page = await asyncio.wait_for(
                        conn.request("GET", f"/jobs/{job_id}/metrics?after={after}"),
                        REQUEST_TIMEOUT_S,
                    )
                except (TimeoutError, OSError, asyncio.IncompleteReadError):
                    status, page = 0, None
                    await conn.close()
                latencies.append(time.perf_counter() - t0)
                if status == 200:
                    after = page["next_after"]
                else:
                    errors += 1
                if interval_s:
                    await asyncio.sleep(interval_s)
        finally:
            await conn.close()

    async def write() -> None:
        nonlocal errors, written
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        conn = Connection(host, port)
        try:
            while time.monotonic() < deadline:
                epoch = next(_WRITER_EPOCHS)
                records = [
                    {"attempt": 1, "rank": BENCH_RANKS - 1, "epoch": epoch, "step": i, "name": "loss",
                     "value": 1.0, "time": time.time()}
                    for i in range(WRITER_BATCH)
                ]
                body = json.dumps({"records": records}).encode()
                try:
                    status, result = await asyncio.wait_for(
                        conn.request("POST", f"/jobs/{job_id}/records", body, headers),
                        REQUEST_TIMEOUT_S,
                    )
                except (TimeoutError, OSError, asyncio.IncompleteReadError):
                    status, result = 0, None
                    await conn.close()
                if status == 200:
                    written += result["accepted"]
                else:
                    errors += 1
                await asyncio.sleep(WRITER_PERIOD_S)
        finally:
            await conn.close()

    t0 = time.perf_counter()
    await asyncio.gather(write(), *(poll(i) for i in range(pollers)))
    wall = time.perf_counter() - t0
    return {
        "requests": len(latencies),
        "rps": len(latencies) / wall,
        "p50_ms": percentile(latencies, 50) * 1000,
        "p99_ms": percentile(latencies, 99) * 1000,
        "errors": errors,
        "written_per_s": written / wall,
    }


def run(smoke: bool) -> list[Row]:
    sizes = [1_000, 5_000] if smoke else [10_000, 100_000, 1_000_000]
    requests = 30 if smoke else 500
    pollers, duration = (10, 1.0) if smoke else (200, 30.0)
    saturation_s = 1.0 if smoke else 10.0
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="bench-poll-") as tmp:
        home = Path(tmp)
        migrate(home)
        job_id, token = insert_running_job(home)
        with Server.start(home, supervisor=False) as server:
            loaded = 0
            for size in sizes:
                t0 = time.perf_counter()
                bulk_load_records(home, job_id, loaded, size - loaded)
                load_s = time.perf_counter() - t0
                loaded = size
                end = max_seq(home, job_id)
                sequential(server, job_id, end - 10, 1000, 5)  # warm the page cache
                tail = sequential(server, job_id, end - 10, 1000, requests)
                page = sequential(server, job_id, end // 2, 1000, max(5, requests // 5))
                label = f"{size:,} records"
                rows += [
                    Row("polling", f"tail poll p50, {label}", percentile(tail, 50) * 1000, "ms"),
                    Row("polling", f"tail poll p99, {label}", percentile(tail, 99) * 1000, "ms",
                        GOAL, f"10 new records per poll; {requests} polls; load {load_s:.1f} s"),
                    Row("polling", f"1000-record page p50, {label}", percentile(page, 50) * 1000,
                        "ms"),
                    Row("polling", f"1000-record page p99, {label}", percentile(page, 99) * 1000,
                        "ms"),
                ]
            end = max_seq(home, job_id)
            paced = asyncio.run(
                _concurrent(server, job_id, token, pollers, duration, POLL_INTERVAL_S, end)
            )
            flat_out = asyncio.run(_concurrent(server, job_id, token, pollers, saturation_s, 0, end))
    what = (
        f"{pollers} pollers, every {POLL_INTERVAL_S} s, {duration:g} s; "
        f"writer {paced['written_per_s']:.0f} rec/s"
    )
    rows += [
        Row("polling", "concurrent: requests/s", paced["rps"], "req/s", "", what),
        Row("polling", "concurrent: p50", paced["p50_ms"], "ms"),
        Row("polling", "concurrent: p99", paced["p99_ms"], "ms", "zero errors"),
        Row("polling", "concurrent: errors", paced["errors"], "", "0",
            "timeouts (30 s) or non-200 answers, pollers and writer"),
        Row("polling", "saturation: requests/s", flat_out["rps"], "req/s", "",
            f"{pollers} pollers with no pause, {saturation_s:g} s, {flat_out['errors']} errors"),
        Row("polling", "saturation: p99", flat_out["p99_ms"], "ms", "",
            "queueing: pollers / throughput"),
    ]
    return rows


if __name__ == "__main__":
    import sys

    for row in run("--smoke" in sys.argv):
        print(row)
