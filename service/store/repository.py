"""Jobs, their records and their resources in SQL. State changes are compare-and-set: zero rows
changed means someone else won. The other stores: the lease (``lease``), the queue snapshot
(``queue``), the change feed (``changefeed``) and chart series (``series``)."""

import time
from collections.abc import Iterable, Sequence

from sqlalchemy import Connection, bindparam, delete, false, func, select, update
from sqlalchemy.orm import Session

from service.store import usage
from service.store.changefeed import note_change
from service.store.clock import utcnow
from service.store.outbox import WEBHOOK_EVENTS, queue_webhook
from service.store.tables import Allocation, Job, JobLabel
from torchyard_contract.bounds import bounded_text
from torchyard_contract.spec import JobSpec
from torchyard_contract.state import ACTIVE_STATES, ALLOWED_FROM, TERMINAL_STATES, JobState


def create_job(
    session: Session, spec: JobSpec, idempotency_key: str | None = None,
    webhooks: dict[str, list[str]] | None = None, owner: str | None = None,
    team: str | None = None,
) -> Job:
    """A queued job; ``webhooks``: endpoint name → events it is told of (``queue_webhook``);
    ``owner``, ``team``: who submitted it, as which team (``service.domain.identity``)."""
    job = Job(
        owner=owner,
        team=team,
        webhooks=webhooks or None,
        name=spec.name,
        state=JobState.queued.value,
        priority=spec.priority,
        preemptible=spec.preemptible,
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
# (docs/benchmarks.md, "Stores and API processes").
_JOBS = Job.__table__
_STATE_OF_JOB = select(_JOBS.c.state).where(_JOBS.c.id == bindparam("job_id"))
_STATE_AND_TEAM = select(_JOBS.c.state, _JOBS.c.team).where(_JOBS.c.id == bindparam("job_id"))


def job_state(conn: Connection | Session, job_id: int) -> str | None:
    """The job's state, or None when there is no such job: one column, no ORM object. Takes a
    plain connection (cheaper than a session for a read) or a session."""
    return conn.execute(_STATE_OF_JOB, {"job_id": job_id}).scalar()


def job_state_and_team(conn: Connection | Session, job_id: int) -> tuple[str, str | None] | None:
    """(state, team) of the job, or None when there is no such job (the hot metrics read)."""
    row = conn.execute(_STATE_AND_TEAM, {"job_id": job_id}).first()
    return (row[0], row[1]) if row is not None else None


def teams_of_jobs(session: Session, job_ids: Sequence[int]) -> dict[int, str | None]:
    """job id → its team, for the jobs that exist."""
    if not job_ids:
        return {}
    q = select(Job.id, Job.team).where(Job.id.in_(job_ids))
    return dict(session.execute(q).tuples().all())


def holders(session: Session, job_ids: Sequence[int]) -> dict[int, tuple[str, str | None, str | None]]:
    """job id → (name, owner, team): what ``GET /resources`` tells of a slot's holder."""
    if not job_ids:
        return {}
    q = select(Job.id, Job.name, Job.owner, Job.team).where(Job.id.in_(job_ids))
    return {i: (n, o, t) for i, n, o, t in session.execute(q).tuples().all()}


def job_by_idempotency_key(session: Session, key: str) -> Job | None:
    return session.scalar(select(Job).where(Job.idempotency_key == key))
def job_id_for_token_hash(session: Session, token_hash: str) -> int | None:
    """The job whose job token hashes to ``token_hash`` (a digest, so equality is safe)."""
    return session.scalar(select(Job.id).where(Job.token_hash == token_hash).limit(1))


def list_jobs(
    session: Session,
    state: JobState | None,
    name: str | None,
    limit: int,
    before_id: int | None,
    labels: Sequence[tuple[str, str | None]] = (),
    *, everyone: bool = True, caller_team: str | None = None, owner: str | None = None,
    team: str | None = None,
) -> Sequence[Job]:
    """Newest first. ``labels``: (key, value) pairs that must all match; value None = has key.
    ``everyone`` False: only ``caller_team``'s jobs (none when it is None); ``owner``, ``team``:
    filters."""
    q = select(Job).order_by(Job.id.desc()).limit(limit)
    if not everyone:
        q = q.where(Job.team == caller_team) if caller_team is not None else q.where(false())
    if owner is not None:
        q = q.where(Job.owner == owner)
    if team is not None:
        q = q.where(Job.team == team)
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
) -> Sequence[tuple[int, int, str, int, float | None, str | None, bool]]:
    """(id, priority, device, nproc_per_node, max_runtime_s, team, preemptible) of every queued
    job: only what a scheduling pass needs, extracted from the spec by the database (no JSON
    decoding here)."""
    q = select(
        Job.id,
        Job.priority,
        Job.spec["device"].as_string(),
        Job.spec["nproc_per_node"].as_integer(),
        Job.spec["max_runtime_s"].as_float(),
        Job.team,
        Job.preemptible,
    ).where(Job.state == JobState.queued.value)
    return session.execute(q).tuples().all()


_ACTIVE = [s.value for s in sorted(ACTIVE_STATES)]


def active_jobs(session: Session) -> Sequence[Job]:
    """Jobs whose group may run (starting, running, pausing), oldest first."""
    states = _ACTIVE
    return session.scalars(select(Job).where(Job.state.in_(states)).order_by(Job.id)).all()


def ids_in_state(session: Session, state: JobState) -> list[int]:
    """Ids of the jobs in ``state``, oldest first."""
    q = select(Job.id).where(Job.state == state.value).order_by(Job.id)
    return list(session.scalars(q).all())


def keep_paused(session: Session, job_id: int, reason: str) -> None:
    """A job pausing or paused for a preemption is paused by a user now: it is not resumed on
    its own (``preempted_and_paused`` no longer lists it)."""
    session.execute(
        update(Job).where(Job.id == job_id, Job.preempted_by.is_not(None),
                          Job.state.in_([JobState.pausing.value, JobState.paused.value]))
        .values(preempted_by=None, reason=reason)
    )
    note_change(session, job_id)


def preempted_and_paused(session: Session) -> list[int]:
    """Ids of paused jobs a preemption paused (they are resumed on their own), oldest first."""
    q = select(Job.id).where(Job.state == JobState.paused.value, Job.preempted_by.is_not(None))
    return list(session.scalars(q.order_by(Job.id)).all())


def queued_with_reference(session: Session) -> Sequence[Job]:
    """Queued jobs already handed to an executor (on Slurm: pending in Slurm's queue)."""
    q = select(Job).where(Job.state == JobState.queued.value, Job.executor_ref.is_not(None))
    return session.scalars(q.order_by(Job.id)).all()


def queued_unsubmitted(session: Session) -> Sequence[Job]:
    """Queued jobs not yet handed to an executor, highest priority first, then oldest."""
    q = select(Job).where(Job.state == JobState.queued.value, Job.executor_ref.is_(None))
    return session.scalars(q.order_by(Job.priority.desc(), Job.id)).all()


def transition(
    session: Session, job_id: int, to: JobState, only_from: JobState | None = None,
    **fields: object,
) -> bool:
    """Move a job to ``to`` only from a state allowed by ``ALLOWED_FROM`` (and only from
    ``only_from``, when given); True if this call won. Each change counts in ``state_changes``.

    A ``reason`` is stored cut to ``REASON_MAX_CHARS`` (it may come from the job: bounded). The
    webhook outbox (``queue_webhook``) gets the change in the same transaction when the job's
    subscriptions name its event: every state change goes through here, so none is missed."""
    allowed = [s.value for s in ALLOWED_FROM[to] if only_from in (None, s)]
    if isinstance(fields.get("reason"), str):
        fields["reason"] = bounded_text(fields["reason"])  # type: ignore[arg-type]
    values: dict[str, object] = {
        "state": to.value, "state_changes": Job.state_changes + 1, **fields}
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


def clear_executor_ref(session: Session, job_id: int) -> None:
    """The executor no longer holds the job (paused): a resume submits it again."""
    session.execute(update(Job).where(Job.id == job_id).values(executor_ref=None))


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
        if prior.get("paused"):
            continue  # a resume, not a restart (the job's own "running" event tells of it)
        queue_webhook(session, job_id, name, webhooks, "restarted", {
            "state": "running", "attempt": number, "previous_attempt_reason": prior.get("reason"),
        })


# --- webhook outbox (service.domain.webhooks.delivery sends it) -----------------------------------------



def allocated_resources(session: Session) -> dict[str, int]:
    return dict(session.execute(select(Allocation.resource, Allocation.job_id)).tuples().all())


def allocate(session: Session, job_id: int, resources: Iterable[str]) -> None:
    """Book ``resources`` for the job and open its usage run (``service.store.usage``) in the
    same transaction: slots held and slots counted never differ."""
    names = list(resources)
    session.add_all(Allocation(resource=r, job_id=job_id) for r in names)
    session.flush()
    usage.open_run(session, job_id, len(names), time.time())


def release(session: Session, job_id: int) -> None:
    """Free the job's resources and close its usage run, if open (once: a second release, by
    another path that frees the same job, closes nothing)."""
    session.execute(delete(Allocation).where(Allocation.job_id == job_id))
    usage.close_runs(session, job_id, time.time())


def request_stop(session: Session, job_id: int, reason: str) -> bool:
    """Note why a guard wants an active job stopped; only the first request counts (CAS).
    True if this call set it. The supervisor acts on it (``stop_requested``)."""
    active = _ACTIVE
    result = session.execute(
        update(Job)
        .where(Job.id == job_id, Job.stop_reason.is_(None), Job.state.in_(active))
        .values(stop_reason=reason)
    )
    return result.rowcount == 1


def stop_requested(session: Session) -> Sequence[tuple[int, str]]:
    """``(job id, stop_reason)`` of active jobs a guard wants stopped."""
    active = _ACTIVE
    q = select(Job.id, Job.stop_reason).where(Job.state.in_(active), Job.stop_reason.is_not(None))
    return session.execute(q).tuples().all()  # type: ignore[return-value]


def count_preemptions(session: Session) -> int:
    """Preemptions of every job there is (a deleted job's are gone with it)."""
    return int(session.scalar(select(func.coalesce(func.sum(Job.preemptions), 0))) or 0)


def count_jobs_by_state(session: Session) -> dict[str, int]:
    """Number of jobs in each state (states with no job are absent)."""
    rows = session.execute(select(Job.state, func.count()).group_by(Job.state)).tuples().all()
    return dict(rows)


# --- deleting jobs (DELETE /jobs/{id}, retention: service.domain.files.cleanup) ----------------------


