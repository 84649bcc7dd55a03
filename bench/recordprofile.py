"""Where a server's CPU goes on the record path: ``py-spy record`` on a live ``torchyard serve``
(SQLite, one API process) while 4 writers post 500-record batches, as ``bench.stores`` does.

``python -m bench.recordprofile [--batches N] [--raw FILE]`` prints the samples by package (the
frame a sample was taken in: pydantic, SQLAlchemy and the driver below it, the HTTP server,
Starlette/FastAPI, the event loop, torchyard's own code) and the functions with most samples of
their own, with the run's records per server CPU-second beside them. It uses only what the
benchmark harness has offered since before issue 50 (``Server.start``, ``insert_running_job``,
``measure``), so a copy of it runs unchanged in a checkout of older code: that is how the
"before" profile in docs/benchmarks.md was taken. py-spy samples Python frames only: time in a C
call (``executemany``, ``json.loads``) counts for the Python function that made it.
"""

import argparse
import collections
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.ingest import measure
from bench.server import BENCH_RANKS, Server, insert_running_job, migrate

RATE_HZ = 200
WRITERS, BATCH = 4, 500
# What a sample's innermost Python frame was doing, by a part of the frame; first match wins.
SQLITE_CALLS = ("do_executemany", "do_execute ", "do_commit", "do_rollback", "_begin_immediate",
                "_release", "fetchall")
BUCKETS = (
    (SQLITE_CALLS, "the database's own work (the driver's C calls: executemany, BEGIN, commit)"),
    (("sqlalchemy", "psycopg"), "SQLAlchemy (Python)"),
    (("pydantic",), "pydantic (validation, serialization)"),
    (("(service/", "(torchyard_contract/", "(<string>"), "torchyard's own Python"),
    (("uvicorn", "httptools", "h11", "starlette", "fastapi"), "HTTP server, routing, middleware"),
    (("asyncio/runners.py",), "the event loop's C (sockets, HTTP parsing)"),
    (("threading.py", "concurrent", "anyio", "asyncio"), "thread pool hand-offs"),
    (("json",), "json (stdlib)"),
)


def _bucket(frame: str) -> str:
    return next((name for parts, name in BUCKETS if any(p in frame for p in parts)), "other")


def _short(frame: str) -> str:
    """``fn (…/site-packages/pkg/mod.py)`` → ``fn (pkg/mod.py)``."""
    name, _, path = frame.partition(" (")
    parts = path.rstrip(")").split("/")
    for anchor in ("site-packages", "service", "torchyard_contract", "python3.11"):
        if anchor in parts:
            parts = parts[parts.index(anchor) + (anchor in ("site-packages", "python3.11")):]
            break
    return f"{name} ({'/'.join(parts[-3:])})"


def summarize(raw: Path, top: int = 12) -> tuple[collections.Counter, collections.Counter, int]:
    """Samples by bucket and by function (own samples), and the total, from py-spy's raw
    (collapsed stack) output."""
    buckets: collections.Counter = collections.Counter()
    own: collections.Counter = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = [f for f in stack.split(";") if not f.startswith("process ")]
        leaf = frames[-1] if frames else "?"
        n = int(count)
        total += n
        buckets[_bucket(leaf)] += n
        own[_short(leaf)] += n
    return buckets, collections.Counter(dict(own.most_common(top))), total


def profile(batches: int, raw_out: Path | None) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-recordprofile-") as tmp:
        home = Path(tmp)
        migrate(home)
        job_id, token = insert_running_job(home, None, adopt_me=True)
        env = {"TORCHYARD_WARM_RANKS": "false"}
        with Server.start(home, env=env) as server:
            measure(server, job_id, token, 1, 1, 10, first_rank=BENCH_RANKS - 1)  # warm-up
            raw = raw_out or home / "profile.txt"
            spy = subprocess.Popen(
                [Path(sys.executable).with_name("py-spy"), "record", "--pid", str(server.proc.pid),
                 "--rate", str(RATE_HZ), "--format", "raw", "--function", "--nonblocking",
                 "--output", str(raw)],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            )
            time.sleep(1.0)  # py-spy attaches (a one-off wait for a tool, not a test's event)
            m = measure(server, job_id, token, WRITERS, batches, BATCH)
            spy.send_signal(signal.SIGINT)
            _, err = spy.communicate(timeout=60)
        if not raw.exists():
            sys.exit(f"py-spy wrote nothing: {err.decode()[-2000:]}")
        buckets, own, total = summarize(raw)
    print(f"{m['records']:,} records, {m['records_per_server_cpu_s']:,.0f} per server CPU-second "
          f"(under py-spy, {RATE_HZ} Hz); code at {os.getcwd()}\n")
    print_tables(buckets, own, total)


def print_tables(buckets: collections.Counter, own: collections.Counter, total: int) -> None:
    print(f"{total:,} samples\n")
    print("| where the samples were | share |\n|---|---:|")
    for name, n in buckets.most_common():
        print(f"| {name} | {n / total:.0%} |")
    print("\n| function (own samples) | share |\n|---|---:|")
    for name, n in own.most_common():
        print(f"| `{name}` | {n / total:.1%} |")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.recordprofile")
    parser.add_argument("--batches", type=int, default=100, help="per writer (default 100)")
    parser.add_argument("--raw", type=Path, help="keep py-spy's collapsed stacks here")
    parser.add_argument("--summarize", type=Path, help="only print the tables of a kept --raw")
    args = parser.parse_args()
    if args.summarize:
        print_tables(*summarize(args.summarize))
    else:
        profile(args.batches, args.raw)


if __name__ == "__main__":
    main()
