"""Jobs and what hangs off them: labels, allocations, records, sweeps and trials, the
supervisor's lease and queue snapshot, webhook deliveries and tracking exports."""

from datetime import datetime

from sqlalchemy import (
    JSON,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    false,
)
from sqlalchemy.orm import Mapped, mapped_column

from service.store.tables.base import Base, Int64


class Job(Base):
    __tablename__ = "jobs"
    # An id is never handed out twice, even after its job is deleted (0014_ids_never_reused).
    __table_args__ = {"sqlite_autoincrement": True}

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(100))
    state: Mapped[str] = mapped_column(String(16), index=True)
    # Copied out of the spec so the queue can be ordered by an index (state, priority, id).
    priority: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # Idempotency-Key of the POST that created the job; a repeated key returns this job.
    idempotency_key: Mapped[str | None] = mapped_column(String(200), unique=True)
    spec: Mapped[dict] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime)
    started_at: Mapped[datetime | None] = mapped_column(DateTime)
    running_at: Mapped[datetime | None] = mapped_column(DateTime)
    ended_at: Mapped[datetime | None] = mapped_column(DateTime)
    first_metric_at: Mapped[datetime | None] = mapped_column(DateTime)
    exit_code: Mapped[int | None] = mapped_column(Integer)
    reason: Mapped[str | None] = mapped_column(Text)
    # Who runs the job's processes ("local", "slurm") and its opaque reference there, which only
    # that executor interprets (service.executor): set at launch, read to re-adopt after a restart.
    executor: Mapped[str | None] = mapped_column(String(16))
    executor_ref: Mapped[str | None] = mapped_column(Text)
    devices: Mapped[str | None] = mapped_column(String(200))
    # Indexed: the auth middleware looks a bearer token up by its hash on every request a rank makes with its job token.
    token_hash: Mapped[str | None] = mapped_column(String(64), index=True)
    # Why a guard (service.domain.records.lossguard: non-finite or diverging loss) wants the job stopped. Set once,
    # compare-and-set, by whichever process ingested the offending record; the supervisor then
    # fails the job with it and stops its group.
    stop_reason: Mapped[str | None] = mapped_column(Text)
    # Attempt records as the job's attempt loop wrote them (see service.run.attemptloop); [] before launch.
    attempts: Mapped[list | None] = mapped_column(JSON)
    # Webhook endpoint name → the events it is told of, fixed at submit (service.settings.webhookfile);
    # null = none. Read by ``repository.transition`` to write the outbox in the same transaction.
    webhooks: Mapped[dict | None] = mapped_column(JSON)
    # A sweep's trial (service.domain.sweeps.driver): its sweep, the parameters it was given, and
    # the epoch its sweep's early-stopping rule pruned it at (state ``cancelled``); else null.
    # No foreign key: added in place (migration 0011_sweeps), the sweeps are never deleted.
    sweep_id: Mapped[int | None] = mapped_column(Integer, index=True)
    params: Mapped[dict | None] = mapped_column(JSON)
    pruned_epoch: Mapped[int | None] = mapped_column(Integer)
    # Every state change counts one (``repository.transition``): states may go back (a resumed
    # job is queued again), so the event stream's cursor counts changes (0012_pause).
    state_changes: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # Times paused (each adds an attempt beyond max_restarts + 1), times preempted by the
    # supervisor, the job that preempted it last (null once it runs again), and the spec's
    # ``preemptible`` copied out for the scheduler (docs/lifecycle.md).
    pauses: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    preemptions: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    preempted_by: Mapped[int | None] = mapped_column(Integer)
    preemptible: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    # Slurm nodes the job leaves out from now on (``--exclude``): each one a rank failed on
    # under a ``retry_elsewhere`` rule (service.domain.loop.finisher); null = none (0013).
    exclude_nodes: Mapped[list | None] = mapped_column(JSON)
    # Who submitted it (a user's name; "admin" for the bootstrap tokens and an open server) and
    # as which team (service.domain.identity); null on jobs older than 0016_identity, which
    # only admins see. A trial carries its sweep's.
    owner: Mapped[str | None] = mapped_column(String(64))
    team: Mapped[str | None] = mapped_column(String(64))


Index("ix_jobs_queue", Job.state, Job.priority, Job.id)
# A member's job list: their team's jobs, newest first.
Index("ix_jobs_team_id", Job.team, Job.id)


class Sweep(Base):
    """A sweep: its request as submitted (``spec``, see ``service.domain.sweeps.spec``) and its
    state (running, then succeeded, failed or cancelled). Its trials are jobs
    (``Job.sweep_id``)."""

    __tablename__ = "sweeps"
    __table_args__ = {"sqlite_autoincrement": True}  # ids never reused, as the jobs'

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(100))
    state: Mapped[str] = mapped_column(String(16), index=True)
    priority: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    spec: Mapped[dict] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime)
    ended_at: Mapped[datetime | None] = mapped_column(DateTime)
    reason: Mapped[str | None] = mapped_column(Text)
    owner: Mapped[str | None] = mapped_column(String(64))  # as Job.owner and Job.team
    team: Mapped[str | None] = mapped_column(String(64), index=True)


class SweepTrial(Base):
    """A sweep's own record of one trial (``service.store.sweeps``): made with its job, in the
    same transaction; its ``number`` counts the sweep's trials from 1. ``outcome`` (completed,
    pruned, failed, cancelled), ``value``, ``state`` and ``reason`` are copied from the job
    before the job is deleted (``DELETE /jobs/{id}``, retention), so deleting a trial's job never
    changes how many trials the sweep made, its counts or its best (0015_sweep_record). No
    foreign key to ``jobs``: the record outlives its job."""

    __tablename__ = "sweep_trials"

    sweep_id: Mapped[int] = mapped_column(ForeignKey("sweeps.id"), primary_key=True)
    number: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(Integer)
    params: Mapped[dict] = mapped_column(JSON)
    outcome: Mapped[str | None] = mapped_column(String(16))
    value: Mapped[float | None] = mapped_column(Float)
    state: Mapped[str | None] = mapped_column(String(16))
    reason: Mapped[str | None] = mapped_column(Text)


class JobLabel(Base):
    """One row per user label, so ``?label=key=value`` is an indexed lookup."""

    __tablename__ = "job_labels"
    __table_args__ = (Index("ix_job_labels_key_value", "key", "value"),)

    job_id: Mapped[int] = mapped_column(
        ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True
    )
    key: Mapped[str] = mapped_column(String(63), primary_key=True)
    value: Mapped[str] = mapped_column(String(200))


class Allocation(Base):
    """One row per resource held by a job; the unique key makes double-booking impossible."""

    __tablename__ = "allocations"

    resource: Mapped[str] = mapped_column(String(32), primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)


class MetricRecord(Base):
    """Append-only; ``seq`` grows with insertion. ``step`` is -1 for per-epoch records."""

    __tablename__ = "metric_records"
    __table_args__ = (
        UniqueConstraint("job_id", "attempt", "rank", "epoch", "step", "name", name="uq_metric_natural"),
        Index("ix_metric_job_seq", "job_id", "seq"),
        {"sqlite_autoincrement": True},
    )

    seq: Mapped[int] = mapped_column(Int64, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    attempt: Mapped[int] = mapped_column(Integer)
    rank: Mapped[int] = mapped_column(Integer)
    epoch: Mapped[int] = mapped_column(Integer)
    step: Mapped[int] = mapped_column(Int64)
    name: Mapped[str] = mapped_column(String(64))
    value: Mapped[float | None] = mapped_column(Float)
    # SQLite turns NaN into NULL, so non-finite values are kept by name: 'NaN', 'Infinity', '-Infinity'.
    nonfinite: Mapped[str | None] = mapped_column(String(9))
    time: Mapped[float] = mapped_column(Float)


class SupervisorLease(Base):
    """Who supervises, until when (``service.domain.lease``). One row, ``name='supervisor'``.

    Times are seconds since the epoch on the database's clock, never a server's, so hosts with
    skewed clocks still agree on expiry. ``generation`` grows with every change of owner.
    """

    __tablename__ = "supervisor_lease"

    name: Mapped[str] = mapped_column(String(32), primary_key=True)
    owner: Mapped[str | None] = mapped_column(String(200))
    host: Mapped[str | None] = mapped_column(String(200))
    generation: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    expires_at: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    renewed_at: Mapped[float | None] = mapped_column(Float)


class QueueSnapshot(Base):
    """The supervisor's last scheduling result, for the server processes that do not supervise
    (``service.domain.queue.snapshot``). One row, ``id=1``, rewritten whole when the result changes.

    ``version`` grows with every write (readers re-parse only when it moved); ``waiting`` is the
    encoded queue (positions, reasons). Only the lease holder writes it (fenced).
    """

    __tablename__ = "queue_snapshot"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    version: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    waiting: Mapped[str] = mapped_column(Text, default="{}", server_default="{}")


class WebhookDelivery(Base):
    """The webhook outbox: one row per (event, endpoint), written in the transaction of the
    state change it tells of (``repository.transition``, ``repository.set_attempts``), sent and
    retried by the supervisor (``service.domain.webhooks.delivery``) until ``state`` is not ``pending``.

    ``body`` is the JSON body as first built, sent byte for byte on every try; ``webhook_id``
    (the ``webhook-id`` header) is the same on every try, so receivers can drop duplicates.
    Times are UTC, like the jobs' own."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (
        Index("ix_webhook_deliveries_due", "state", "next_attempt_at"),
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(Int64, primary_key=True, autoincrement=True)
    # No foreign key: a pending delivery outlives its deleted job and is still sent
    # (0014_ids_never_reused); job ids are never reused, so it names no other job.
    job_id: Mapped[int] = mapped_column(Integer, index=True)
    endpoint: Mapped[str] = mapped_column(String(64))
    event: Mapped[str] = mapped_column(String(16))
    webhook_id: Mapped[str] = mapped_column(String(64), unique=True)
    body: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime)
    # pending (to be sent), delivered (a 2xx answer), failed (given up).
    state: Mapped[str] = mapped_column(String(12), default="pending", server_default="pending")
    attempts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    next_attempt_at: Mapped[datetime] = mapped_column(DateTime)
    last_attempt_at: Mapped[datetime | None] = mapped_column(DateTime)
    last_status_code: Mapped[int | None] = mapped_column(Integer)
    last_error: Mapped[str | None] = mapped_column(Text)
    delivered_at: Mapped[datetime | None] = mapped_column(DateTime)


# --- who is who (service.domain.identity, docs/security.md "Users, teams and roles") ---------
# Ids are never reused (AUTOINCREMENT on SQLite): a revoked token's id, or an audit row's, never
# names another one later.


class TrackingExport(Base):
    """The tracking outbox: one row per job (or sweep) whose records are exported to MLflow
    and/or TensorBoard (``service.domain.tracking``), written in the transaction that creates
    the job or sweep; the acting supervisor exports from the stored records by ``seq`` cursor.

    ``acked_seq``: every record of the job with ``seq`` up to it is in the MLflow run.
    ``sent_seq`` > ``acked_seq``: a batch up to it was handed to MLflow and its outcome is not
    known (a crash, a timeout): before anything else it is sent again less what MLflow's metric
    history already holds (docs/tracking.md). ``status``: the MLflow status last set.
    ``mlflow_done`` / ``tensorboard_done``: nothing more to export (the job or sweep is over and
    everything is out); ``done`` when both are. Times are UTC, like the jobs' own."""

    __tablename__ = "tracking_exports"
    __table_args__ = (
        Index("ix_tracking_exports_due", "done", "next_try_at"),
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(Int64, primary_key=True, autoincrement=True)
    job_id: Mapped[int | None] = mapped_column(
        ForeignKey("jobs.id", ondelete="CASCADE"), unique=True)
    # No foreign key: sweeps are never deleted (as ``Job.sweep_id``).
    sweep_id: Mapped[int | None] = mapped_column(Integer, unique=True)
    mlflow: Mapped[bool] = mapped_column(Boolean)
    tensorboard: Mapped[bool] = mapped_column(Boolean)
    experiment: Mapped[str | None] = mapped_column(String(256))
    log_outputs: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    # A random id in the run's tags: a run whose creation was sent but not answered is found
    # by it (runs/search) instead of being created twice.
    export_key: Mapped[str] = mapped_column(String(32))
    experiment_id: Mapped[str | None] = mapped_column(String(64))
    run_id: Mapped[str | None] = mapped_column(String(64))
    # Where MLflow keeps the run's artifacts (``mlflow-artifacts:/…`` when its server proxies them).
    artifact_uri: Mapped[str | None] = mapped_column(String(1024))
    acked_seq: Mapped[int] = mapped_column(Int64, default=0, server_default="0")
    sent_seq: Mapped[int] = mapped_column(Int64, default=0, server_default="0")
    status: Mapped[str | None] = mapped_column(String(16))
    mlflow_done: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    tensorboard_done: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    done: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    # The last MLflow failure (null after a success), how many in a row, and the next try.
    error: Mapped[str | None] = mapped_column(Text)
    failures: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    next_try_at: Mapped[datetime] = mapped_column(DateTime)
    created_at: Mapped[datetime] = mapped_column(DateTime)
