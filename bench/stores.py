"""SQLite and PostgreSQL side by side, with one and two API processes (``serve --workers``).

For each store: record ingestion (4 writers x 1000-record batches, as ``bench.ingest``) with 1
and 2 API processes; 200 pollers every 0.5 s with a writer (as ``bench.polling``) on 2; and
commit → SSE event: 100 ``/events`` streams on one job while a writer posts one record every
50 ms; each record carries its send time, so the latency is *POST sent → event received* on
every stream (an upper bound of commit → event: it includes the POST's own parsing and commit).

PostgreSQL is a throwaway local cluster (``tests.pgserver``: ``initdb`` + ``pg_ctl``, fsync off);
skipped with a row saying so where PostgreSQL is not installed. The server CPU figures count
the torchyard processes, not PostgreSQL's backends.
"""

import asyncio
import json
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

from bench.common import Row, percentile
from bench.ingest import measure
from bench.polling import POLL_INTERVAL_S, _concurrent, sequential
from bench.server import (
    BENCH_RANKS,
    Server,
    bulk_load_records,
    insert_running_job,
    max_seq,
    migrate,
)

INGEST_GOAL = ">= 50,000 records/s (2 cores), both stores"
SSE_GOAL = "p99 <= 50 ms with 100 streams"
POLL_GOAL = "p99 <= 100 ms, zero errors"
TAIL_GOAL = "p99 <= 10 ms at 1M records"
TAIL_RECORDS = 1_000_000
SSE_PERIOD_S = 0.05
SSE_RANK = 7


@contextmanager
def _store(name: str, home: Path) -> Iterator[str | None]:
    """The database URL of a fresh store (None = SQLite under ``home``)."""
    if name == "sqlite":
        migrate(home)
        yield None
        return
    from tests import pgserver

    bindir = pgserver.find_bindir()
    if bindir is None:
        raise LookupError("PostgreSQL is not installed")
    server = pgserver.start(bindir)
    try:
        url = server.create_database()
        from service.store.db import upgrade

        upgrade(url)
        yield url
    finally:
        server.stop()


async def _sse_latency(server: Server, job_id: int, token: str, streams: int,
                       duration_s: float) -> dict[str, float]:
    """``streams`` raw SSE readers; a writer posts one record (value = its send time) per period."""
    url = urlsplit(server.url)
    host, port = url.hostname or "127.0.0.1", url.port or 80
    latencies: list[float] = []
    opened = 0
    stop = asyncio.Event()

    async def stream() -> None:
        nonlocal opened
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(f"GET /jobs/{job_id}/events HTTP/1.1\r\nHost: {host}\r\n"
                     "Accept: text/event-stream\r\n\r\n".encode())
        await reader.readuntil(b"\r\n\r\n")
        opened += 1
        event = None
        try:
            while not stop.is_set():
                line = await asyncio.wait_for(reader.readline(), 5)
                if line.startswith(b"event:"):
                    event = line[6:].strip()
                elif line.startswith(b"data:") and event == b"metric":
                    record = json.loads(line[5:])
                    if record["rank"] == SSE_RANK:
                        latencies.append(time.time() - record["value"])
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def write() -> int:
        from bench.loadgen import Connection

        while opened < streams:
            await asyncio.sleep(0.05)
        await asyncio.sleep(1.0)  # every stream has caught up with the history
        conn = Connection(host, port)
        headers = {"Authorization": f"Bearer {token}"}
        posted, step = 0, 0
        deadline = time.monotonic() + duration_s
        try:
            while time.monotonic() < deadline:
                now = time.time()
                body = json.dumps({"records": [{"attempt": 1, "rank": SSE_RANK, "epoch": 1,
                                                "step": step,
                                                "name": "loss", "value": now, "time": now}]})
                status, _ = await conn.request("POST", f"/jobs/{job_id}/records", body.encode(),
                                               headers)
                posted += status == 200
                step += 1
                await asyncio.sleep(SSE_PERIOD_S)
        finally:
            await conn.close()
        await asyncio.sleep(1.0)
        stop.set()
        return posted

    readers = [asyncio.create_task(stream()) for _ in range(streams)]
    posted = await write()
    await asyncio.gather(*readers)
    return {
        "posted": posted,
        "events": len(latencies),
        "p50_ms": percentile(latencies, 50) * 1000,
        "p99_ms": percentile(latencies, 99) * 1000,
    }


def _bulk_load(home: Path, url: str | None, job_id: int, count: int) -> None:
    """``count`` records for ``job_id`` straight through SQL (set-up speed, not the HTTP path)."""
    if url is None:
        bulk_load_records(home, job_id, 0, count)
        return
    from sqlalchemy import create_engine

    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            # The same shape as bench.server's rows: 8 ranks, 4 metric names, unique keys.
            conn.exec_driver_sql(
                "INSERT INTO metric_records "
                "(job_id, attempt, rank, epoch, step, name, value, nonfinite, time) "
                "SELECT %(job)s, 1, i %% 8, i / 32, i / 8 %% 4, "
                "(ARRAY['loss','samples','seconds','samples_per_s'])[i %% 4 + 1], i, NULL, "
                "extract(epoch from now()) FROM generate_series(0, %(n)s - 1) AS i",
                {"job": job_id, "n": count},
            )
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql("VACUUM ANALYZE metric_records")
    finally:
        engine.dispose()


def _tail_polls(server: Server, home: Path, url: str | None, records: int,
                requests: int) -> list[Row]:
    """A caught-up poller (10 new records per poll) on a job with ``records`` records."""
    job_id, _token = insert_running_job(home, url, adopt_me=True)
    t0 = time.perf_counter()
    _bulk_load(home, url, job_id, records)
    load_s = time.perf_counter() - t0
    last = _max_seq(home, url, job_id)
    sequential(server, job_id, last - 10, 1000, 20)  # warm the caches
    tail = sequential(server, job_id, last - 10, 1000, requests)
    store = "sqlite" if url is None else "postgresql"
    return [Row("stores", f"{store}: caught-up poll p99, {records:,} records",
                percentile(tail, 99) * 1000, "ms", TAIL_GOAL,
                f"{requests} polls, 10 new records each; p50 {percentile(tail, 50) * 1000:.1f} ms;"
                f" loaded in {load_s:.0f} s")]


def _max_seq(home: Path, url: str | None, job_id: int) -> int:
    if url is None:
        return max_seq(home, job_id)
    from sqlalchemy import create_engine

    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return conn.exec_driver_sql(
                "SELECT max(seq) FROM metric_records WHERE job_id = %(job)s", {"job": job_id}
            ).scalar_one()
    finally:
        engine.dispose()


def _bench_store(store: str, smoke: bool, only_sse: bool = False) -> list[Row]:
    batches = 2 if smoke else 50
    pollers, poll_s = (10, 1.0) if smoke else (200, 20.0)
    streams, sse_s = (5, 1.0) if smoke else (100, 10.0)
    rows: list[Row] = []
    for processes in (1, 2):
        with tempfile.TemporaryDirectory(prefix=f"bench-{store}-") as tmp, \
                _store(store, Path(tmp)) as url:
            home = Path(tmp)
            env = {"TORCHYARD_DATABASE_URL": url} if url else {}
            job_id, token = insert_running_job(home, url, adopt_me=True)
            args = ("--workers", str(processes)) if processes > 1 else ()
            with Server.start(home, env=env, args=args) as server:
                if only_sse and processes == 2:
                    continue
                measure(server, job_id, token, 1, 1, 10, first_rank=BENCH_RANKS - 1)  # warm-up
                m = measure(server, job_id, token, 4, batches, 1000)
                assert m["errors"] == 0 and m["records"] == m["expected"], m
                rows += [
                    Row("stores", f"{store}, {processes} API process(es): ingest records/s",
                        m["records_per_s"], "rec/s", INGEST_GOAL,
                        f"4 writers x {batches} x 1000; POST p99 {m['p99_ms']:.0f} ms"),
                    Row("stores", f"{store}, {processes} API process(es): records per server CPU-s",
                        m["records_per_server_cpu_s"], "rec/cpu-s", "",
                        "torchyard processes only"),
                ]
                if processes == 2:
                    paced = asyncio.run(_concurrent(
                        server, job_id, token, pollers, poll_s, POLL_INTERVAL_S, m["records"]
                    ))
                    rows += [
                        Row("stores", f"{store}, 2 API processes: {pollers} pollers p99",
                            paced["p99_ms"], "ms", POLL_GOAL,
                            f"every {POLL_INTERVAL_S} s, {poll_s:g} s, writer "
                            f"{paced['written_per_s']:.0f} rec/s; p50 {paced['p50_ms']:.1f} ms"),
                        Row("stores", f"{store}, 2 API processes: {pollers} pollers errors",
                            paced["errors"], "", "0"),
                    ]
                    burst = asyncio.run(_concurrent(  # caught up: the writer went on
                        server, job_id, token, pollers, poll_s / 2, POLL_INTERVAL_S,
                        _max_seq(home, url, job_id), together=True,
                    ))
                    rows.append(Row(
                        "stores", f"{store}, 2 API processes: {pollers} pollers starting together p99",
                        burst["p99_ms"], "ms", "", f"{poll_s / 2:g} s; p50 "
                        f"{burst['p50_ms']:.1f} ms; {burst['errors']} errors; the first burst queues",
                    ))
                    rows += _tail_polls(server, home, url, 5_000 if smoke else TAIL_RECORDS,
                                        30 if smoke else 500)
                else:
                    # A job of its own: the streams start with no history to replay.
                    sse_job, sse_token = insert_running_job(home, url, adopt_me=True)
                    sse = asyncio.run(_sse_latency(server, sse_job, sse_token, streams, sse_s))
                    rows += [
                        Row("stores", f"{store}: POST → SSE event p50, {streams} streams",
                            sse["p50_ms"], "ms", "", f"{sse['posted']} records posted, "
                            f"{sse['events']} events received"),
                        Row("stores", f"{store}: POST → SSE event p99, {streams} streams",
                            sse["p99_ms"], "ms", SSE_GOAL, "one record every 50 ms"),
                    ]
    return rows


def run(smoke: bool, only_sse: bool = False) -> list[Row]:
    rows: list[Row] = []
    for store in ("sqlite", "postgresql"):
        try:
            rows += _bench_store(store, smoke, only_sse)
        except LookupError as exc:
            rows.append(Row("stores", f"{store}: skipped", str(exc), ""))
    return rows


if __name__ == "__main__":
    import sys

    for row in run("--smoke" in sys.argv, "--sse" in sys.argv):
        print(row)
