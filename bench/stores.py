"""SQLite and PostgreSQL side by side, with one and two API processes (``serve --workers``), every
figure beside a baseline measured in the same run (issue 50).

For each store:

* **the bare loop** (``bench.bareloop``): ``json.loads`` of the very bodies the writers post and
  one idempotent ``executemany`` per body into the same migrated table, one commit per batch
  (PostgreSQL: ``INSERT … ON CONFLICT DO NOTHING`` executemany, and ``COPY``), in records per
  CPU-second; median of ``REPEATS``;
* **ingestion** with 1 and 2 API processes: 4 writers × ``batches`` × 500-record batches (a rank's
  batch, ``worker.reporter.BATCH_MAX``), records per server CPU-second (the torchyard
  processes; PostgreSQL's backends are not counted, as in the bare loop), median of
  ``REPEATS``, and its ratio to the bare loop (goal ≥ 0.5);
* **commit → SSE event** on 1 API process: one ``/events`` stream, then 100 on another job, while a
  writer posts one record every 50 ms (``bench.streams``); the 100 streams' p99 beside the one
  stream's;
* **200 pollers** every 0.5 s with a writer, on 2 API processes, beside one poller (every 0.1 s, for
  samples) with the same writer;
* **a caught-up poll** (10 new records per poll) on a job of 1,000,000 records, beside the same
  poll on a job of 1,000.

PostgreSQL is a throwaway local cluster (``tests.pgserver``: ``initdb`` + ``pg_ctl``, fsync off),
one per store for the whole run; skipped with a row saying so where it is not installed. Warm
ranks are off: no job runs here, and the warm pool's start-up (importing torch) would count as
server CPU. ``python -m bench.stores [--smoke] [--only ingest|sse|poll]`` runs parts alone.
"""

import asyncio
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from bench import bareloop
from bench.common import Row, percentile
from bench.ingest import _bodies, measure, server_cpu, server_processes
from bench.polling import POLL_INTERVAL_S, _concurrent, sequential
from bench.server import (
    BENCH_RANKS,
    Server,
    bulk_load_records,
    insert_running_job,
    max_seq,
    migrate,
)
from bench.streams import sse_latency

WRITERS = 4
BATCH = 500  # worker.reporter.BATCH_MAX
REPEATS = 3
RATIO_GOAL = ">= 0.5x the bare loop"
SSE_GOAL = "p99 <= 50 ms with 100 streams"
POLL_GOAL = "p99 <= 100 ms, zero errors"
TAIL_GOAL = "p99 <= 10 ms at 1M records"
TAIL_RECORDS = 1_000_000
TAIL_BASE_RECORDS = 1_000
BASE_POLL_INTERVAL_S = 0.1
PARTS = ("ingest", "sse", "poll")
IDLE_S = 5.0  # how long the idle server's CPU is measured before the ingest runs


@contextmanager
def _cluster(store: str) -> Iterator[Callable[[Path], str | None]]:
    """A function making a fresh migrated database under a home: its URL (None = SQLite)."""
    if store == "sqlite":
        yield lambda home: migrate(home)
        return
    from tests import pgserver

    bindir = pgserver.find_bindir()
    if bindir is None:
        raise LookupError("PostgreSQL is not installed")
    server = pgserver.start(bindir)
    try:
        from service.store.db import upgrade

        def fresh(_home: Path) -> str:
            url = server.create_database()
            upgrade(url)
            return url

        yield fresh
    finally:
        server.stop()


def _ratio(value: float, base: float) -> float:
    return value / base if base else float("nan")


def _baseline(store: str, url: str | None, bodies: list[bytes], repeats: int) -> list[Row]:
    if store == "sqlite":
        bare = bareloop.sqlite_baseline(bodies, repeats)
        what = "json.loads + INSERT OR IGNORE executemany, one commit per batch"
        return [Row("stores", f"{store}: bare loop records per CPU-s", bare["median"],
                    "rec/cpu-s", "", f"{what}; runs {_runs(bare['runs'])}")]
    assert url is not None
    many = bareloop.postgres_baseline(url, bodies, repeats)
    copy = bareloop.postgres_baseline(url, bodies, repeats, copy=True)
    return [
        Row("stores", f"{store}: bare loop records per CPU-s", copy["median"], "rec/cpu-s", "",
            f"json.loads + COPY, one commit per batch; runs {_runs(copy['runs'])}"),
        Row("stores", f"{store}: bare loop, executemany, records per CPU-s", many["median"],
            "rec/cpu-s", "", "json.loads + INSERT … ON CONFLICT DO NOTHING executemany; runs "
            f"{_runs(many['runs'])}"),
    ]


def _runs(values: list[float]) -> str:
    return " / ".join(f"{v:,.0f}" for v in values)


def _idle_cpu_rate(server: Server, seconds: float) -> float:
    """CPU-seconds per second the server's processes take with nothing asked of them (the
    supervisor ticking over its running job, the lease, the listener): measured here, so a
    run's record-path CPU can be told from what the server costs per second whatever it does."""
    procs = server_processes(server)
    cpu0, t0 = server_cpu(procs), time.perf_counter()
    time.sleep(seconds)
    return (server_cpu(procs) - cpu0) / (time.perf_counter() - t0)


def _ingest(store: str, workers: int, server: Server, job_id: int, token: str, batches: int,
            repeats: int, bare: float, idle_s: float) -> list[Row]:
    measure(server, job_id, token, 1, 1, 10, first_rank=BENCH_RANKS - 1)  # warm-up
    idle = _idle_cpu_rate(server, idle_s)
    runs, nets = [], []
    for repeat in range(repeats):  # each on ranks of its own: every record is new
        m = measure(server, job_id, token, WRITERS, batches, BATCH, first_rank=repeat * WRITERS)
        assert m["errors"] == 0 and m["records"] == m["expected"], m
        runs.append(m)
        record_path_cpu = m["server_cpu_s"] - idle * m["wall_s"]
        nets.append(m["records"] / record_path_cpu if record_path_cpu > 0 else float("nan"))
    per_cpu = statistics.median(m["records_per_server_cpu_s"] for m in runs)
    net = statistics.median(nets)
    label = f"{store}, {workers} API process{'es' if workers > 1 else ''}"
    return [
        Row("stores", f"{label}: records per server CPU-s", per_cpu, "rec/cpu-s", "",
            f"{WRITERS} writers x {batches} x {BATCH}, median of {repeats}: "
            f"{_runs([m['records_per_server_cpu_s'] for m in runs])}; every CPU-second of the "
            f"server's processes; bare loop {bare:,.0f}"),
        Row("stores", f"{label}: records per record-path CPU-s", net, "rec/cpu-s", "",
            f"the same runs less the idle server's {idle * 1000:.0f} ms of CPU per s over "
            f"each run's wall time: {_runs(nets)}"),
        Row("stores", f"{label}: ratio to the bare loop", _ratio(net, bare), "x", RATIO_GOAL,
            f"record path; every server CPU-second: {_ratio(per_cpu, bare):.2f}x"),
        Row("stores", f"{label}: ingest records/s", statistics.median(
            m["records_per_s"] for m in runs), "rec/s", "", "wall time: depends on the load; "
            f"POST p99 {statistics.median(m['p99_ms'] for m in runs):.0f} ms"),
    ]


def _sse(store: str, server: Server, home: Path, url: str | None, streams: int,
         duration_s: float) -> list[Row]:
    # Jobs of their own: the streams start with no history to replay.
    one_job, one_token = insert_running_job(home, url, adopt_me=True)
    one = asyncio.run(sse_latency(server, one_job, one_token, 1, duration_s))
    many_job, many_token = insert_running_job(home, url, adopt_me=True)
    many = asyncio.run(sse_latency(server, many_job, many_token, streams, duration_s))
    return [
        Row("stores", f"{store}: POST → SSE event p99, 1 stream", one["p99_ms"], "ms", "",
            f"p50 {one['p50_ms']:.1f} ms; {one['events']} events; one record every 50 ms"),
        Row("stores", f"{store}: POST → SSE event p99, {streams} streams", many["p99_ms"], "ms",
            SSE_GOAL, f"p50 {many['p50_ms']:.1f} ms; {many['posted']} records posted, "
            f"{many['events']} events received"),
        Row("stores", f"{store}: SSE p99, {streams} streams / 1 stream",
            _ratio(many["p99_ms"], one["p99_ms"]), "x", ""),
    ]


def _pollers(store: str, server: Server, home: Path, url: str | None, job_id: int, token: str,
             pollers: int, duration_s: float) -> list[Row]:
    after = _max_seq(home, url, job_id)
    one = asyncio.run(_concurrent(server, job_id, token, 1, duration_s, BASE_POLL_INTERVAL_S,
                                  after))
    paced = asyncio.run(_concurrent(server, job_id, token, pollers, duration_s, POLL_INTERVAL_S,
                                    _max_seq(home, url, job_id)))
    burst = asyncio.run(_concurrent(  # caught up: the writer went on
        server, job_id, token, pollers, duration_s / 2, POLL_INTERVAL_S,
        _max_seq(home, url, job_id), together=True,
    ))
    return [
        Row("stores", f"{store}, 2 API processes: 1 poller p99", one["p99_ms"], "ms", "",
            f"every {BASE_POLL_INTERVAL_S} s, {duration_s:g} s, same writer; p50 "
            f"{one['p50_ms']:.1f} ms; {one['errors']} errors"),
        Row("stores", f"{store}, 2 API processes: {pollers} pollers p99", paced["p99_ms"], "ms",
            POLL_GOAL, f"every {POLL_INTERVAL_S} s, {duration_s:g} s, writer "
            f"{paced['written_per_s']:.0f} rec/s; p50 {paced['p50_ms']:.1f} ms"),
        Row("stores", f"{store}, 2 API processes: {pollers} pollers errors", paced["errors"], "", "0"),
        Row("stores", f"{store}, 2 API processes: {pollers} pollers / 1 poller, p99",
            _ratio(paced["p99_ms"], one["p99_ms"]), "x", ""),
        Row("stores", f"{store}, 2 API processes: {pollers} pollers starting together p99",
            burst["p99_ms"], "ms", "", f"{duration_s / 2:g} s; p50 {burst['p50_ms']:.1f} ms; "
            f"{burst['errors']} errors; the first burst queues"),
    ]


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


def _caught_up(server: Server, home: Path, url: str | None, records: int, requests: int
               ) -> tuple[list[float], float]:
    """Latencies of a caught-up poller (10 new records per poll) on a job of ``records``."""
    job_id, _token = insert_running_job(home, url, adopt_me=True)
    t0 = time.perf_counter()
    _bulk_load(home, url, job_id, records)
    load_s = time.perf_counter() - t0
    last = _max_seq(home, url, job_id)
    sequential(server, job_id, last - 10, 1000, 20)  # warm the caches
    return sequential(server, job_id, last - 10, 1000, requests), load_s


def _tail_polls(store: str, server: Server, home: Path, url: str | None, records: int,
                requests: int) -> list[Row]:
    base, _ = _caught_up(server, home, url, TAIL_BASE_RECORDS, requests)
    tail, load_s = _caught_up(server, home, url, records, requests)
    return [
        Row("stores", f"{store}: caught-up poll p99, {TAIL_BASE_RECORDS:,} records",
            percentile(base, 99) * 1000, "ms", "", f"{requests} polls; p50 "
            f"{percentile(base, 50) * 1000:.1f} ms"),
        Row("stores", f"{store}: caught-up poll p99, {records:,} records",
            percentile(tail, 99) * 1000, "ms", TAIL_GOAL,
            f"{requests} polls, 10 new records each; p50 {percentile(tail, 50) * 1000:.1f} ms;"
            f" loaded in {load_s:.0f} s"),
        Row("stores", f"{store}: caught-up poll p99, {records:,} / {TAIL_BASE_RECORDS:,} records",
            _ratio(percentile(tail, 99), percentile(base, 99)), "x", ""),
    ]


def _max_seq(home: Path, url: str | None, job_id: int) -> int:
    if url is None:
        return max_seq(home, job_id)
    from sqlalchemy import create_engine

    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return conn.exec_driver_sql(
                "SELECT coalesce(max(seq), 0) FROM metric_records WHERE job_id = %(job)s",
                {"job": job_id},
            ).scalar_one()
    finally:
        engine.dispose()


def _bench_store(store: str, smoke: bool, parts: tuple[str, ...]) -> list[Row]:
    batches = 2 if smoke else 50
    repeats = 1 if smoke else REPEATS
    pollers, poll_s = (10, 1.0) if smoke else (200, 20.0)
    streams, sse_s = (5, 1.0) if smoke else (100, 10.0)
    bodies = [body for w in range(WRITERS) for body in _bodies(w, batches, BATCH)]
    rows: list[Row] = []
    with _cluster(store) as fresh:
        bare = 0.0
        if "ingest" in parts:
            with tempfile.TemporaryDirectory(prefix=f"bench-{store}-bare-") as tmp:
                rows += _baseline(store, fresh(Path(tmp)), bodies, repeats)
                bare = rows[0].value  # type: ignore[assignment]
        for workers in (1, 2):
            if (workers == 1 and not {"ingest", "sse"} & set(parts)) or (
                    workers == 2 and not {"ingest", "poll"} & set(parts)):
                continue
            with tempfile.TemporaryDirectory(prefix=f"bench-{store}-") as tmp:
                home = Path(tmp)
                url = fresh(home)
                env = {"TORCHYARD_WARM_RANKS": "false"}
                if url:
                    env["TORCHYARD_DATABASE_URL"] = url
                job_id, token = insert_running_job(home, url, adopt_me=True)
                args = ("--workers", str(workers)) if workers > 1 else ()
                with Server.start(home, env=env, args=args) as server:
                    if "ingest" in parts:
                        rows += _ingest(store, workers, server, job_id, token, batches, repeats,
                                        bare, 0.5 if smoke else IDLE_S)
                    if workers == 1 and "sse" in parts:
                        rows += _sse(store, server, home, url, streams, sse_s)
                    if workers == 2 and "poll" in parts:
                        rows += _pollers(store, server, home, url, job_id, token, pollers, poll_s)
                        rows += _tail_polls(store, server, home, url,
                                            5_000 if smoke else TAIL_RECORDS,
                                            30 if smoke else 500)
    return rows


def run(smoke: bool, parts: tuple[str, ...] = PARTS) -> list[Row]:
    rows: list[Row] = []
    for store in ("sqlite", "postgresql"):
        try:
            rows += _bench_store(store, smoke, parts)
        except LookupError as exc:
            rows.append(Row("stores", f"{store}: skipped", str(exc), ""))
    return rows


if __name__ == "__main__":
    import argparse

    from bench.__main__ import render
    from bench.common import machine

    parser = argparse.ArgumentParser(prog="python -m bench.stores")
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--only", choices=PARTS, action="append")
    args = parser.parse_args()
    before = machine()
    rows = run(args.smoke, tuple(args.only or PARTS))
    print(render({"stores": rows}, before, machine(), args.smoke))
