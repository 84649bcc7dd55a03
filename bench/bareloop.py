"""The bare loop: the floor under the record path, measured on the machine of the run.

What a store can do with the very bodies the benchmarks post, with nothing of a server around
it: ``json.loads`` of each body, one tuple per record, and one idempotent ``executemany`` into
the real ``metric_records`` table (migrated by Alembic: the same indexes as the server's), one
commit per batch:

* SQLite: ``INSERT OR IGNORE … executemany`` (WAL, ``synchronous=NORMAL``, as the server);
* PostgreSQL: psycopg's ``executemany`` of ``INSERT … ON CONFLICT DO NOTHING`` (the same
  idempotent write), and ``COPY … FROM STDIN`` as a second figure (no ``ON CONFLICT``: a retried
  batch would fail, so it is what a store that gave up idempotence could do).

The figure is records per CPU-second of this process (user + system, psutil): the server's
figures count the torchyard processes the same way, and neither counts PostgreSQL's backends.
A ratio *server per CPU-second / bare loop per CPU-second* then says how close the record path
is to its floor whatever the machine and its load.
"""

import json
import sqlite3
import statistics
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import psutil

COLUMNS = "job_id, attempt, rank, epoch, step, name, value, nonfinite, time"
SQLITE_INSERT = f"INSERT OR IGNORE INTO metric_records ({COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
POSTGRES_INSERT = (
    f"INSERT INTO metric_records ({COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)"
    " ON CONFLICT DO NOTHING"
)
POSTGRES_COPY = f"COPY metric_records ({COLUMNS}) FROM STDIN"
REPEATS = 3


def _rows(job_id: int, body: bytes) -> list[tuple]:
    return [
        (job_id, r["attempt"], r["rank"], r["epoch"], r["step"], r["name"], r["value"], None,
         r["time"])
        for r in json.loads(body)["records"]
    ]


def _cpu_s() -> float:
    times = psutil.Process().cpu_times()
    return times.user + times.system


def _per_cpu_s(loop: Callable[[], int]) -> float:
    cpu0 = _cpu_s()
    stored = loop()
    return stored / (_cpu_s() - cpu0)


def sqlite_rate(path: Path, job_id: int, bodies: Sequence[bytes]) -> float:
    """Records per CPU-second of the SQLite bare loop over ``bodies`` into the database at
    ``path`` (migrated, ``job_id`` a row of ``jobs``)."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA foreign_keys=ON")
        conn.execute("PRAGMA synchronous=NORMAL")

        def loop() -> int:
            stored = 0
            for body in bodies:
                conn.execute("BEGIN IMMEDIATE")
                stored += conn.executemany(SQLITE_INSERT, _rows(job_id, body)).rowcount
                conn.execute("COMMIT")
            return stored

        return _per_cpu_s(loop)
    finally:
        conn.close()


def postgres_rate(url: str, job_id: int, bodies: Sequence[bytes], *, copy: bool = False) -> float:
    """Records per CPU-second of this process for the PostgreSQL bare loop (``url``: the
    SQLAlchemy URL of a migrated database); ``copy``: ``COPY`` instead of ``executemany``."""
    import psycopg

    from service.store.changefeed import _libpq_url

    with psycopg.connect(_libpq_url(url)) as conn:

        def loop() -> int:
            stored = 0
            for body in bodies:
                rows = _rows(job_id, body)
                with conn.cursor() as cur:
                    if copy:
                        with cur.copy(POSTGRES_COPY) as out:
                            for row in rows:
                                out.write_row(row)
                    else:
                        cur.executemany(POSTGRES_INSERT, rows)
                conn.commit()
                stored += len(rows)
            return stored

        return _per_cpu_s(loop)


def median_rate(measure: Callable[[], float], repeats: int = REPEATS) -> dict[str, Any]:
    """``measure()`` ``repeats`` times (each into an empty table): the median and every run."""
    runs = [measure() for _ in range(repeats)]
    return {"median": statistics.median(runs), "runs": runs}


def sqlite_baseline(bodies: Sequence[bytes], repeats: int = REPEATS) -> dict[str, Any]:
    """The SQLite bare loop over ``bodies``, ``repeats`` times, each for a new job of a fresh
    database migrated by Alembic."""
    from bench.server import db_path, insert_running_job, migrate

    with tempfile.TemporaryDirectory(prefix="bench-bare-") as tmp:
        home = Path(tmp)
        migrate(home)

        def once() -> float:
            job_id, _token = insert_running_job(home)
            return sqlite_rate(db_path(home), job_id, bodies)

        return median_rate(once, repeats)


def postgres_baseline(
    url: str, bodies: Sequence[bytes], repeats: int = REPEATS, *, copy: bool = False
) -> dict[str, Any]:
    """The PostgreSQL bare loop, ``repeats`` times, each for a new job of the migrated
    database at ``url``."""
    from bench.server import insert_running_job

    def once() -> float:
        job_id, _token = insert_running_job(Path(tempfile.gettempdir()), url)
        return postgres_rate(url, job_id, bodies, copy=copy)

    return median_rate(once, repeats)
