"""Jobs, their records and their resources in SQL. State changes are compare-and-set: zero rows
changed means someone else won. The other stores: the lease (``lease``), the queue snapshot
(``queue``), the change feed (``changefeed``) and chart series (``series``)."""

import json
import math
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, Row, bindparam, delete, func, select, update
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from service.store.changefeed import note_change
from service.store.tables import Allocation, Job, JobLabel, MetricRecord, WebhookDelivery
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


def create_job(
    session: Session, spec: JobSpec, idempotency_key: str | None = None,
    webhooks: dict[str, list[str]] | None = None,
) -> Job:
    """A queued job; ``webhooks``: endpoint name → events it is told of (``queue_webhook``)."""
    job = Job(
        webhooks=webhooks or None,
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

    A ``reason`` is stored cut to ``REASON_MAX_CHARS`` (it may come from the job: bounded). The
    webhook outbox (``queue_webhook``) gets the change in the same transaction when the job's
    subscriptions name its event: every state change goes through here, so none is missed."""
    allowed = [s.value for s in ALLOWED_FROM[to]]
    if isinstance(fields.get("reason"), str):
        fields["reason"] = bounded_text(fields["reason"])  # type: ignore[arg-type]
    values: dict[str, object] = {"state": to.value, **fields}
    if to in TERMINAL_STATES:
        values.setdefault("ended_at", utcnow())
    rows = session.execute(
        update(Job).where(Job.id == job_id, Job.state.in_(allowed)).values(**values)
        .returning(Job.name, Job.webhooks, Job.reason, Job.exit_code)
    ).all()
    if len(rows) != 1:
        return False
    name, webhooks, reason, exit_code = rows[0]
    if webhooks and to.value in WEBHOOK_EVENTS:
        data: dict[str, object] = {"state": to.value}
        if to in TERMINAL_STATES:
            data.update(reason=reason, exit_code=exit_code)
        queue_webhook(session, job_id, name, webhooks, to.value, data)
    note_change(session, job_id)
    return True


def set_executor_ref(session: Session, job_id: int, executor: str, reference: str) -> None:
    """Which executor runs the job and its opaque reference to it."""
    session.execute(
        update(Job).where(Job.id == job_id).values(executor=executor, executor_ref=reference)
    )


def set_token_hash(session: Session, job_id: int, token_hash: str) -> None:
    session.execute(update(Job).where(Job.id == job_id).values(token_hash=token_hash))


def set_exit_code_if_unknown(session: Session, job_id: int, exit_code: int | None) -> None:
    """A job already terminal (cancelled by the user) still says how its processes exited."""
    session.execute(
        update(Job).where(Job.id == job_id, Job.exit_code.is_(None)).values(exit_code=exit_code)
    )


def set_attempts(session: Session, job_id: int, attempts: list[dict]) -> None:
    """Store the job's attempt records; each ``reason`` cut to ``REASON_MAX_CHARS``.

    An attempt numbered above every stored one, after the first, is a restart: the outbox gets
    a ``restarted`` event for it in this transaction (when the job's subscriptions name it)."""
    attempts = [
        {**a, "reason": bounded_text(a["reason"])} if isinstance(a.get("reason"), str) else a
        for a in attempts
    ]
    before = session.execute(
        select(Job.name, Job.webhooks, Job.attempts).where(Job.id == job_id)
    ).first()
    session.execute(update(Job).where(Job.id == job_id).values(attempts=attempts))
    if before is not None and before.webhooks:
        _queue_restarts(session, job_id, before.name, before.webhooks, before.attempts or [],
                        attempts)
    note_change(session, job_id)


def _queue_restarts(
    session: Session, job_id: int, name: str, webhooks: dict, old: list[dict], new: list[dict]
) -> None:
    seen = max((a.get("number", 0) for a in old), default=0)
    previous = {a.get("number"): a for a in new}
    for attempt in new:
        number = attempt.get("number", 0)
        if not isinstance(number, int) or number <= max(seen, 1):
            continue
        prior = previous.get(number - 1) or {}
        queue_webhook(session, job_id, name, webhooks, "restarted", {
            "state": "running", "attempt": number, "previous_attempt_reason": prior.get("reason"),
        })


# --- webhook outbox (service.domain.webhooks sends it) -----------------------------------------

WEBHOOK_EVENTS = frozenset({"running", "succeeded", "failed", "cancelled", "restarted"})
DELIVERY_PENDING, DELIVERY_DELIVERED, DELIVERY_FAILED = "pending", "delivered", "failed"


def queue_webhook(
    session: Session, job_id: int, name: str, webhooks: dict, event: str, data: dict
) -> None:
    """One outbox row per subscribed endpoint whose events include ``event``; the body is the
    Standard Webhooks JSON payload (``type``, ``timestamp``, ``data``), fixed now and sent byte
    for byte on every try under one ``webhook-id``."""
    endpoints = [e for e, events in webhooks.items() if event in (events or ())]
    if not endpoints:
        return
    now = utcnow()
    body = json.dumps({
        "type": f"job.{event}",
        "timestamp": now.isoformat(timespec="milliseconds") + "Z",
        "data": {"job_id": job_id, "name": name, "event": event, **data},
    }, separators=(",", ":"))
    session.add_all(
        WebhookDelivery(
            job_id=job_id, endpoint=endpoint, event=event, webhook_id=f"msg_{uuid.uuid4().hex}",
            body=body, created_at=now, state=DELIVERY_PENDING, attempts=0, next_attempt_at=now,
        )
        for endpoint in endpoints
    )
    session.flush()


def due_deliveries(
    session: Session, now: datetime, limit: int, skip: Iterable[int] = ()
) -> Sequence[WebhookDelivery]:
    """Pending deliveries whose next try is due, oldest due first, at most ``limit``, leaving
    out ``skip`` (those being sent); an index range scan (state, next_attempt_at)."""
    q = select(WebhookDelivery).where(
        WebhookDelivery.state == DELIVERY_PENDING, WebhookDelivery.next_attempt_at <= now
    )
    skip = list(skip)
    if skip:
        q = q.where(WebhookDelivery.id.not_in(skip))
    return session.scalars(q.order_by(WebhookDelivery.next_attempt_at).limit(limit)).all()


def next_delivery_due(session: Session) -> datetime | None:
    """When the earliest pending delivery is due, or None when none is pending."""
    q = select(func.min(WebhookDelivery.next_attempt_at)).where(
        WebhookDelivery.state == DELIVERY_PENDING
    )
    return session.scalar(q)


def record_delivery_try(
    session: Session, delivery_id: int, at: datetime, status_code: int | None,
    error: str | None, next_at: datetime | None,
) -> None:
    """One try of a pending delivery: delivered (``error`` None), retried at ``next_at``, or
    given up (``next_at`` None). A delivery no longer pending (another supervisor's try) keeps
    its outcome."""
    values: dict[str, object] = {
        "attempts": WebhookDelivery.attempts + 1, "last_attempt_at": at,
        "last_status_code": status_code,
        "last_error": bounded_text(error) if error else None,
    }
    if error is None:
        values.update(state=DELIVERY_DELIVERED, delivered_at=at)
    elif next_at is None:
        values.update(state=DELIVERY_FAILED)
    else:
        values.update(next_attempt_at=next_at)
    session.execute(
        update(WebhookDelivery)
        .where(WebhookDelivery.id == delivery_id, WebhookDelivery.state == DELIVERY_PENDING)
        .values(**values)
    )


def job_deliveries(session: Session, job_id: int) -> Sequence[WebhookDelivery]:
    """A job's webhook deliveries in the order their events happened."""
    q = select(WebhookDelivery).where(WebhookDelivery.job_id == job_id)
    return session.scalars(q.order_by(WebhookDelivery.id)).all()


def delete_deliveries(session: Session, job_id: int) -> int:
    """Remove a job's webhook deliveries (sent or not); for deleting the job. Rows removed."""
    result = session.execute(delete(WebhookDelivery).where(WebhookDelivery.job_id == job_id))
    return result.rowcount


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
