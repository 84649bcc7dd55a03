"""All SQL lives here. State changes are compare-and-set: zero rows changed means someone else won."""

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, Row, bindparam, delete, func, select, update
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from service.store.changefeed import note_change
from service.store.tables import Allocation, Job, JobLabel, MetricRecord
from torchyard_contract.bounds import bounded_text
from torchyard_contract.records import decode_value, nonfinite_name
from torchyard_contract.spec import JobSpec
from torchyard_contract.state import ALLOWED_FROM, TERMINAL_STATES, JobState

EPOCH_STEP = -1  # stored step of a per-epoch record; the API shows it as null


def utcnow() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


@dataclass(frozen=True)
class RecordIn:
    attempt: int
    rank: int
    epoch: int | None
    step: int | None
    name: str
    value: float
    time: float


def create_job(session: Session, spec: JobSpec, idempotency_key: str | None = None) -> Job:
    job = Job(
        name=spec.name,
        state=JobState.queued.value,
        priority=spec.priority,
        idempotency_key=idempotency_key,
        spec=spec.model_dump(mode="json"),
        created_at=utcnow(),
    )
    session.add(job)
    session.flush()
    session.add_all(JobLabel(job_id=job.id, key=k, value=v) for k, v in spec.labels.items())
    session.flush()
    note_change(session, job.id)
    return job


def get_job(session: Session, job_id: int) -> Job | None:
    return session.get(Job, job_id)


# The hot reads (every metrics poll, every event stream wake-up) run these statements, built
# once: a statement made per call costs more in SQLAlchemy than the query costs in the database
# (docs/benchmarks.md, "Stores and workers").
_JOBS = Job.__table__
_RECORDS = MetricRecord.__table__
_STATE_OF_JOB = select(_JOBS.c.state).where(_JOBS.c.id == bindparam("job_id"))
_RECORDS_AFTER = (
    select(_RECORDS)
    .where(_RECORDS.c.job_id == bindparam("job_id"), _RECORDS.c.seq > bindparam("after"))
    .order_by(_RECORDS.c.seq)
    .limit(bindparam("limit"))
)


def job_state(conn: Connection | Session, job_id: int) -> str | None:
    """The job's state, or None when there is no such job: one column, no ORM object. Takes a
    plain connection (cheaper than a session for a read) or a session."""
    return conn.execute(_STATE_OF_JOB, {"job_id": job_id}).scalar()


def job_by_idempotency_key(session: Session, key: str) -> Job | None:
    return session.scalar(select(Job).where(Job.idempotency_key == key))
def job_id_for_token_hash(session: Session, token_hash: str) -> int | None:
    """The job whose worker token hashes to ``token_hash`` (a digest, so equality is safe)."""
    return session.scalar(select(Job.id).where(Job.token_hash == token_hash).limit(1))


def list_jobs(
    session: Session,
    state: JobState | None,
    name: str | None,
    limit: int,
    before_id: int | None,
    labels: Sequence[tuple[str, str | None]] = (),
) -> Sequence[Job]:
    """Newest first. ``labels``: (key, value) pairs that must all match; value None = has key."""
    q = select(Job).order_by(Job.id.desc()).limit(limit)
    if state is not None:
        q = q.where(Job.state == state.value)
    if name is not None:
        q = q.where(Job.name == name)
    for key, value in labels:
        match = select(JobLabel.job_id).where(JobLabel.key == key)
        if value is not None:
            match = match.where(JobLabel.value == value)
        q = q.where(Job.id.in_(match))
    if before_id is not None:
        q = q.where(Job.id < before_id)
    return session.scalars(q).all()


def queued_for_scheduling(
    session: Session,
) -> Sequence[tuple[int, int, str, int, float | None]]:
    """(id, priority, device, nproc_per_node, max_runtime_s) of every queued job: only what a
    scheduling pass needs, extracted from the spec by the database (no JSON decoding here)."""
    q = select(
        Job.id,
        Job.priority,
        Job.spec["device"].as_string(),
        Job.spec["nproc_per_node"].as_integer(),
        Job.spec["max_runtime_s"].as_float(),
    ).where(Job.state == JobState.queued.value)
    return session.execute(q).tuples().all()


def active_jobs(session: Session) -> Sequence[Job]:
    states = [JobState.starting.value, JobState.running.value]
    return session.scalars(select(Job).where(Job.state.in_(states)).order_by(Job.id)).all()


def queued_with_reference(session: Session) -> Sequence[Job]:
    """Queued jobs already handed to an executor (on Slurm: pending in Slurm's queue)."""
    q = select(Job).where(Job.state == JobState.queued.value, Job.executor_ref.is_not(None))
    return session.scalars(q.order_by(Job.id)).all()


def queued_unsubmitted(session: Session) -> Sequence[Job]:
    """Queued jobs not yet handed to an executor, highest priority first, then oldest."""
    q = select(Job).where(Job.state == JobState.queued.value, Job.executor_ref.is_(None))
    return session.scalars(q.order_by(Job.priority.desc(), Job.id)).all()


def transition(session: Session, job_id: int, to: JobState, **fields: object) -> bool:
    """Move a job to ``to`` only from a state allowed by ``ALLOWED_FROM``; True if this call won.

    A ``reason`` is stored cut to ``REASON_MAX_CHARS`` (it may come from the job: bounded)."""
    allowed = [s.value for s in ALLOWED_FROM[to]]
    if isinstance(fields.get("reason"), str):
        fields["reason"] = bounded_text(fields["reason"])  # type: ignore[arg-type]
    values: dict[str, object] = {"state": to.value, **fields}
    if to in TERMINAL_STATES:
        values.setdefault("ended_at", utcnow())
    result = session.execute(
        update(Job).where(Job.id == job_id, Job.state.in_(allowed)).values(**values)
    )
    if result.rowcount != 1:
        return False
    note_change(session, job_id)
    return True


def set_attempts(session: Session, job_id: int, attempts: list[dict]) -> None:
    """Store the job's attempt records; each ``reason`` cut to ``REASON_MAX_CHARS``."""
    attempts = [
        {**a, "reason": bounded_text(a["reason"])} if isinstance(a.get("reason"), str) else a
        for a in attempts
    ]
    session.execute(update(Job).where(Job.id == job_id).values(attempts=attempts))
    note_change(session, job_id)


def allocated_resources(session: Session) -> dict[str, int]:
    return dict(session.execute(select(Allocation.resource, Allocation.job_id)).tuples().all())


def allocate(session: Session, job_id: int, resources: Iterable[str]) -> None:
    session.add_all(Allocation(resource=r, job_id=job_id) for r in resources)
    session.flush()


def release(session: Session, job_id: int) -> None:
    session.execute(delete(Allocation).where(Allocation.job_id == job_id))


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
        cur.execute("SELECT pg_advisory_xact_lock(%s, %s)", (_RECORDS_LOCK_CLASS, job_id))
        cur.execute(f"SAVEPOINT {_COPY_SAVEPOINT}")
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


def mark_first_metric(session: Session, job_id: int, records: Sequence[RecordIn]) -> None:
    """Set the job's ``first_metric_at`` from the earliest rank time in ``records``, once.

    Later batches change nothing, except one holding an earlier record (a spool replayed
    after the API was down), which moves it back.
    """
    if not records:
        return
    first = datetime.fromtimestamp(min(r.time for r in records), UTC).replace(tzinfo=None)
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


def request_stop(session: Session, job_id: int, reason: str) -> bool:
    """Note why a guard wants an active job stopped; only the first request counts (CAS).
    True if this call set it. The supervisor acts on it (``stop_requested``)."""
    active = [JobState.starting.value, JobState.running.value]
    result = session.execute(
        update(Job)
        .where(Job.id == job_id, Job.stop_reason.is_(None), Job.state.in_(active))
        .values(stop_reason=reason)
    )
    return result.rowcount == 1


def stop_requested(session: Session) -> Sequence[tuple[int, str]]:
    """``(job id, stop_reason)`` of active jobs a guard wants stopped."""
    active = [JobState.starting.value, JobState.running.value]
    q = select(Job.id, Job.stop_reason).where(Job.state.in_(active), Job.stop_reason.is_not(None))
    return session.execute(q).tuples().all()  # type: ignore[return-value]


# --- chart series and progress (dashboard) -----------------------------------------------------


def series_rows(
    session: Session, job_id: int, name: str, steps: bool
) -> Sequence[tuple[int, int, int, int, float | None, str | None]]:
    """``(attempt, rank, epoch, step, value, nonfinite)`` of one metric of a job: the per-epoch
    records, or with ``steps`` the per-step ones. Core rows, not ORM ones: 100k rows stay cheap."""
    m = MetricRecord
    step_filter = m.step != EPOCH_STEP if steps else m.step == EPOCH_STEP
    q = (
        select(m.attempt, m.rank, m.epoch, m.step, m.value, m.nonfinite)
        .where(m.job_id == job_id, m.name == name, step_filter)
        .order_by(m.attempt, m.rank, m.epoch, m.step)
    )
    return session.connection().execute(q).tuples().all()


def metric_names(session: Session, job_id: int) -> list[str]:
    """The distinct metric names a job has reported, sorted."""
    q = select(MetricRecord.name).where(MetricRecord.job_id == job_id).distinct()
    return sorted(session.scalars(q).all())


def last_record(session: Session, job_id: int) -> tuple[int, int] | None:
    """``(seq, epoch)`` of the job's newest record, or None: one indexed lookup (job_id, seq)."""
    q = (
        select(MetricRecord.seq, MetricRecord.epoch)
        .where(MetricRecord.job_id == job_id)
        .order_by(MetricRecord.seq.desc())
        .limit(1)
    )
    row = session.execute(q).first()
    return (row[0], row[1]) if row else None


def count_jobs_by_state(session: Session) -> dict[str, int]:
    """Number of jobs in each state (states with no job are absent)."""
    rows = session.execute(select(Job.state, func.count()).group_by(Job.state)).tuples().all()
    return dict(rows)


# --- deleting jobs (DELETE /jobs/{id}, retention: service.domain.cleanup) ----------------------

# Every table that holds rows of a job besides ``jobs``; deleting a job empties each of them.
# Webhooks (issue 24, item 4): add the job's deliveries table here, and nothing else changes.
JOB_OWNED_TABLES: tuple[type, ...] = (MetricRecord, JobLabel, Allocation)


def delete_record_batch(session: Session, job_id: int, limit: int) -> int:
    """Delete up to ``limit`` of the job's metric records (oldest first); how many went. Small
    batches, each its own transaction, keep a long history from holding the write lock."""
    seqs = select(MetricRecord.seq).where(MetricRecord.job_id == job_id).order_by(
        MetricRecord.seq).limit(limit)
    result = session.execute(delete(MetricRecord).where(MetricRecord.seq.in_(seqs)))
    return int(result.rowcount or 0)  # type: ignore[attr-defined]


def delete_job_rows(session: Session, job_id: int) -> bool:
    """Delete a terminal job and every row it owns (``JOB_OWNED_TABLES``); False when it is gone
    or not terminal (compare-and-delete: a job that was re-queued or is running stays)."""
    state = job_state(session, job_id)
    if state is None or JobState(state) not in TERMINAL_STATES:  # terminal stays terminal
        return False
    for table in JOB_OWNED_TABLES:  # children first: no foreign key is ever left dangling
        session.execute(delete(table).where(table.job_id == job_id))  # type: ignore[attr-defined]
    session.execute(delete(Job).where(Job.id == job_id))
    note_change(session, job_id)
    return True


def terminal_jobs_ended_before(session: Session, cutoff: datetime, limit: int) -> list[int]:
    """Ids of terminal jobs that ended before ``cutoff``, oldest first."""
    terminal = [s.value for s in TERMINAL_STATES]
    q = select(Job.id).where(Job.state.in_(terminal), Job.ended_at < cutoff)
    return list(session.scalars(q.order_by(Job.ended_at, Job.id).limit(limit)))


def packages_in_use(session: Session) -> set[str]:
    """Packages that queued or running jobs name (the ones the store must keep)."""
    live = [s.value for s in JobState if s not in TERMINAL_STATES]
    specs = session.scalars(select(Job.spec).where(Job.state.in_(live)))
    return {s["package"] for s in specs if isinstance(s, dict) and s.get("package")}


def job_ids(session: Session) -> set[int]:
    return set(session.scalars(select(Job.id)))
