"""A job's metric records in SQL: inserted once (replays ignored), read after a cursor.

On PostgreSQL a batch is copied (``COPY``) under the job's advisory lock, falling back to one
``INSERT … ON CONFLICT DO NOTHING``; on SQLite one ``INSERT OR IGNORE`` per batch.
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, Row, bindparam, select, update
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from service.store.changefeed import note_change
from service.store.tables import Job, MetricRecord
from torchyard_contract.records import decode_value, nonfinite_name

EPOCH_STEP = -1  # stored step of a per-epoch record; the API shows it as null


@dataclass(frozen=True, slots=True)
class RecordIn:
    attempt: int
    rank: int
    epoch: int | None
    step: int | None
    name: str
    value: float
    time: float


_RECORDS = MetricRecord.__table__
_JOBS = Job.__table__


# What a batch needs to know of its job, read in the batch's own write transaction: one row of
# plain columns, built once (an ORM Job per batch, with every column, showed in profiles).
_JOB_FOR_RECORDS = select(
    _JOBS.c.id, _JOBS.c.state, _JOBS.c.spec, _JOBS.c.attempts, _JOBS.c.first_metric_at,
    _JOBS.c.token_hash, _JOBS.c.ended_at,
).where(_JOBS.c.id == bindparam("job_id"))


def job_for_records(session: Session, job_id: int) -> Row[Any] | None:
    """The job's ``id``, ``state``, ``spec``, ``attempts``, ``first_metric_at``,
    ``token_hash`` and ``ended_at`` as attributes of one row (what scope, the loss guard, the
    first-metric time and the token check read); None when there is no such job."""
    # Through the session's connection: the ORM's execution path costs more than the query.
    return session.connection().execute(_JOB_FOR_RECORDS, {"job_id": job_id}).first()


_RECORDS_AFTER = (
    select(_RECORDS)
    .where(_RECORDS.c.job_id == bindparam("job_id"), _RECORDS.c.seq > bindparam("after"))
    .order_by(_RECORDS.c.seq)
    .limit(bindparam("limit"))
)


_RECORD_COLUMNS = "job_id, attempt, rank, epoch, step, name, value, nonfinite, time"


_SQLITE_INSERT_RECORD = (
    f"INSERT INTO metric_records ({_RECORD_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
    " ON CONFLICT DO NOTHING"
)


# PostgreSQL, the common case: a batch of new records streamed in with COPY (psycopg formats
# the rows in C; the array parameters of an INSERT were dumped in Python, a quarter of the
# server's time per batch, docs/benchmarks.md). COPY has no ON CONFLICT, so it runs in a
# savepoint: a batch holding a replayed record rolls back to it and goes in through the
# statement below instead.
_POSTGRES_COPY_RECORDS = f"COPY metric_records ({_RECORD_COLUMNS}) FROM STDIN"


_COPY_SAVEPOINT = "torchyard_records_copy"


# The whole batch as one row of arrays, unnested server-side; replays of a natural key are
# skipped. The rows really added are counted through RETURNING (psycopg's rowcount is not the
# number of rows ON CONFLICT DO NOTHING let through).
_POSTGRES_INSERT_RECORDS = (
    "WITH added AS ("
    f" INSERT INTO metric_records ({_RECORD_COLUMNS})"
    " SELECT * FROM unnest("
    "%s::int8[], %s::int[], %s::int[], %s::int[], %s::int8[], %s::text[],"
    " %s::float8[], %s::text[], %s::float8[])"
    " ON CONFLICT DO NOTHING RETURNING 1)"
    " SELECT count(*) FROM added"
)


# Taken before a job's records are inserted, held to commit. PostgreSQL hands out ``seq`` from a
# sequence when a row is inserted, not when it commits: two concurrent batches of one job could
# commit in the other order, and a reader whose cursor passed the later ``seq`` would never see
# the earlier one. Under this lock a job's batches commit in ``seq`` order (SQLite gets the same
# from its single writer). Key space: (class, job id), so other advisory locks never collide.
_RECORDS_LOCK_CLASS = 0x7479  # "ty"


def insert_records(session: Session, job_id: int, records: Sequence[RecordIn]) -> int:
    """Insert a batch; replays of a natural key are ignored. Returns rows added.

    On PostgreSQL the caller's transaction holds the job's record lock until it commits (see
    ``_RECORDS_LOCK_CLASS``): commit soon after.
    """
    if not records:
        return 0
    rows = [_record_row(job_id, r) for r in records]
    conn = session.connection()
    if conn.dialect.name == "postgresql":
        added = _insert_postgres(conn.connection.driver_connection, job_id, rows)
    else:
        # One statement run with a parameter list (executemany), on the driver directly:
        # SQLAlchemy's per-row parameter processing costs as much as SQLite's own insert work,
        # and a multi-row VALUES clause would be compiled anew for every batch
        # (docs/benchmarks.md).
        added = conn.exec_driver_sql(_SQLITE_INSERT_RECORD, rows).rowcount
    if added:
        note_change(session, job_id)
    return added


def _record_row(job_id: int, r: RecordIn) -> tuple:
    """The table's columns (``_RECORD_COLUMNS``) of one record; a non-finite value is stored as
    its name with a NULL ``value``."""
    finite = math.isfinite(r.value)
    return (
        job_id, r.attempt, r.rank,
        r.epoch if r.epoch is not None else 0,
        r.step if r.step is not None else EPOCH_STEP,
        r.name,
        r.value if finite else None,
        None if finite else nonfinite_name(r.value),
        r.time,
    )


def _insert_postgres(raw: Any, job_id: int, rows: list[tuple]) -> int:
    """``rows`` into ``metric_records`` on the psycopg connection of the caller's transaction.

    The job's record lock is waited for at most the connection's ``lock_timeout``
    (``service.store.db``). The driver's errors are raised as SQLAlchemy's, as for every other
    statement, so callers (``service.store.db.is_busy``, the API's 503) see one kind."""
    import psycopg

    try:
        return _copy_records(raw, job_id, rows)
    except psycopg.Error as exc:
        raise DBAPIError.instance(
            _POSTGRES_COPY_RECORDS, None, exc, psycopg.Error
        ) from exc


def _copy_records(raw: Any, job_id: int, rows: list[tuple]) -> int:
    import psycopg

    with raw.cursor() as cur:
        # One round trip for both: a query without parameters goes by the simple protocol,
        # which takes several statements (both numbers are ints, formatted by us).
        cur.execute(f"SELECT pg_advisory_xact_lock({_RECORDS_LOCK_CLASS:d}, {job_id:d}); "
                    f"SAVEPOINT {_COPY_SAVEPOINT}")
        try:
            with cur.copy(_POSTGRES_COPY_RECORDS) as copy:
                for row in rows:
                    copy.write_row(row)
        except psycopg.errors.UniqueViolation:
            cur.execute(f"ROLLBACK TO SAVEPOINT {_COPY_SAVEPOINT}")
            cur.execute(_POSTGRES_INSERT_RECORDS, [list(column) for column in zip(*rows, strict=True)])
            return int(cur.fetchone()[0])
        cur.execute(f"RELEASE SAVEPOINT {_COPY_SAVEPOINT}")
        return len(rows)


def mark_first_metric(
    session: Session, job_id: int, records: Sequence[RecordIn], known: datetime | None = None
) -> None:
    """Set the job's ``first_metric_at`` from the earliest rank time in ``records``, once.

    Later batches change nothing, except one holding an earlier record (a spool replayed
    after the API was down), which moves it back. ``known``: the job's ``first_metric_at`` as
    read in this transaction; a batch no earlier than it writes nothing (the value only ever
    moves back, so a stale ``known`` can only cost the conditional UPDATE below).
    """
    if not records:
        return
    first = datetime.fromtimestamp(min(r.time for r in records), UTC).replace(tzinfo=None)
    if known is not None and known <= first:
        return
    session.execute(
        update(Job)
        .where(Job.id == job_id)
        .where((Job.first_metric_at.is_(None)) | (Job.first_metric_at > first))
        .values(first_metric_at=first)
    )


def read_records(
    conn: Connection | Session,
    job_id: int,
    after: int,
    limit: int,
    rank: int | None = None,
    name: str | None = None,
) -> Sequence[Row[Any]]:
    """Records with ``seq > after`` in ``seq`` order, at most ``limit``; an index range scan.

    Plain rows with the table's columns as attributes (``seq``, ``rank``, ``value``, ...), not
    ORM objects: building 1000 ORM instances cost more than the query (docs/benchmarks.md).
    """
    q = _RECORDS_AFTER
    if rank is not None:
        q = q.where(_RECORDS.c.rank == rank)
    if name is not None:
        q = q.where(_RECORDS.c.name == name)
    return conn.execute(q, {"job_id": job_id, "after": after, "limit": limit}).all()


def epoch_losses(
    session: Session, job_id: int, attempt: int, first: int, last: int, rank: int | None = None
) -> list[tuple[int, int, float]]:
    """``(rank, epoch, value)`` of the per-epoch ``loss`` records of one attempt with
    ``first <= epoch <= last`` (one rank's, or every rank's); non-finite values as floats."""
    m = MetricRecord
    q = select(m.rank, m.epoch, m.value, m.nonfinite).where(
        m.job_id == job_id, m.attempt == attempt, m.name == "loss", m.step == EPOCH_STEP,
        m.epoch >= first, m.epoch <= last,
    )
    if rank is not None:
        q = q.where(m.rank == rank)
    return [
        (r, e, decode_value(nf) if nf else float(v))
        for r, e, v, nf in session.execute(q).tuples().all()
    ]
