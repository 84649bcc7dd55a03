"""SQL of sweeps and their trials (a trial is a job with ``sweep_id``, and a row of the sweep's own
record, ``sweep_trials``). State changes are compare-and-set, as for jobs
(``service.store.repository``)."""

from collections.abc import Sequence

from sqlalchemy import exists, false, or_, select, update
from sqlalchemy.orm import Session

from service.store.changefeed import note_change
from service.store.records import EPOCH_STEP
from service.store.repository import utcnow
from service.store.tables import Job, MetricRecord, Sweep, SweepTrial
from torchyard_contract.bounds import bounded_text
from torchyard_contract.records import decode_value
from torchyard_contract.state import ACTIVE_STATES, JobState, SweepState, TrialOutcome

RUNNING = SweepState.running.value
SWEEP_STATES = tuple(s.value for s in SweepState)
_LIVE_JOB_STATES = [JobState.queued.value, *(s.value for s in ACTIVE_STATES)]


def create_sweep(
    session: Session, name: str, priority: int, spec: dict, owner: str | None = None,
    team: str | None = None,
) -> Sweep:
    sweep = Sweep(name=name, state=RUNNING, priority=priority, spec=spec, created_at=utcnow(),
                  owner=owner, team=team)
    session.add(sweep)
    session.flush()
    return sweep


def get_sweep(session: Session, sweep_id: int) -> Sweep | None:
    return session.get(Sweep, sweep_id)


def list_sweeps(
    session: Session, state: str | None, limit: int, before_id: int | None,
    *, everyone: bool = True, caller_team: str | None = None, owner: str | None = None,
    team: str | None = None,
) -> Sequence[Sweep]:
    """Newest first; ``before_id``: the cursor (sweeps with a smaller id); the other arguments
    as for ``repository.list_jobs``."""
    q = select(Sweep).order_by(Sweep.id.desc()).limit(limit)
    if not everyone:
        q = q.where(Sweep.team == caller_team) if caller_team is not None else q.where(false())
    if owner is not None:
        q = q.where(Sweep.owner == owner)
    if team is not None:
        q = q.where(Sweep.team == team)
    if state is not None:
        q = q.where(Sweep.state == state)
    if before_id is not None:
        q = q.where(Sweep.id < before_id)
    return session.scalars(q).all()


def anything_unfinished(session: Session) -> bool:
    """True if a job is not terminal (paused counts) or a sweep runs: only then has the
    supervisor's tick work beyond what it keeps in memory. One indexed query, so an idle server's
    tick costs one read (``service.domain.loop.supervisor``)."""
    unfinished = [*_LIVE_JOB_STATES, JobState.paused.value]
    q = select(or_(exists().where(Job.state.in_(unfinished)),
                   exists().where(Sweep.state == RUNNING)))
    return bool(session.scalar(q))


def running_sweeps(session: Session) -> Sequence[Sweep]:
    return session.scalars(select(Sweep).where(Sweep.state == RUNNING).order_by(Sweep.id)).all()


def end_sweep(
    session: Session, sweep_id: int, state: SweepState, reason: str | None
) -> bool:
    """running → ``state`` (succeeded, failed, cancelled); True if this call won."""
    result = session.execute(
        update(Sweep).where(Sweep.id == sweep_id, Sweep.state == RUNNING).values(
            state=SweepState(state).value, reason=bounded_text(reason) if reason else None,
            ended_at=utcnow(),
        )
    )
    return result.rowcount == 1


def trials(session: Session, sweep_id: int) -> Sequence[Job]:
    """The sweep's trials, oldest first (their order of creation is the study's order)."""
    return session.scalars(select(Job).where(Job.sweep_id == sweep_id).order_by(Job.id)).all()


def mark_trial(session: Session, job_id: int, sweep_id: int, number: int, params: dict) -> None:
    """Make job ``job_id`` the sweep's trial ``number``: the job carries its sweep and
    parameters, and the sweep's record gains the trial (in the caller's transaction, the one that
    made the job: the primary key refuses a second trial ``number``)."""
    session.execute(update(Job).where(Job.id == job_id).values(sweep_id=sweep_id, params=params))
    session.add(SweepTrial(sweep_id=sweep_id, number=number, job_id=job_id, params=params))
    session.flush()


def trial_records(session: Session, sweep_id: int) -> Sequence[SweepTrial]:
    """The sweep's record of every trial it made, by number (the study's order); a trial whose
    job was deleted keeps its row."""
    q = select(SweepTrial).where(SweepTrial.sweep_id == sweep_id).order_by(SweepTrial.number)
    return session.scalars(q).all()


def trial_record(session: Session, sweep_id: int, job_id: int) -> SweepTrial | None:
    """The sweep's record of the trial that job ``job_id`` is (the latest, should an id be
    reused after its job was deleted)."""
    q = select(SweepTrial).where(SweepTrial.sweep_id == sweep_id, SweepTrial.job_id == job_id)
    return session.scalars(q.order_by(SweepTrial.number.desc()).limit(1)).first()


def settle_trial(
    session: Session, sweep_id: int, number: int, *, outcome: TrialOutcome, value: float | None,
    state: str, reason: str | None,
) -> bool:
    """Copy how a trial ended into the sweep's record before its job is deleted (compare-and-set:
    a record settled once stays as it was). ``state`` set marks the job as deleted."""
    result = session.execute(
        update(SweepTrial).where(
            SweepTrial.sweep_id == sweep_id, SweepTrial.number == number,
            SweepTrial.state.is_(None),
        ).values(outcome=TrialOutcome(outcome).value, value=value, state=state,
                 reason=bounded_text(reason) if reason else None)
    )
    return result.rowcount == 1


def prune_trial(session: Session, job_id: int, epoch: int, reason: str) -> bool:
    """A running trial → ``cancelled`` with ``pruned_epoch`` and the rule's reason (CAS: a trial
    that ended meanwhile stays as it ended). True if this call won."""
    allowed = [s.value for s in ACTIVE_STATES]
    result = session.execute(
        update(Job).where(Job.id == job_id, Job.state.in_(allowed)).values(
            state=JobState.cancelled.value, reason=bounded_text(reason), pruned_epoch=epoch,
            ended_at=utcnow(),
        )
    )
    if result.rowcount != 1:
        return False
    note_change(session, job_id)
    return True


def live_trials_of_ended_sweeps(session: Session) -> Sequence[int]:
    """Trials still queued or running whose sweep has ended (a cancel that did not reach them)."""
    ended = select(Sweep.id).where(Sweep.state != RUNNING)
    q = select(Job.id).where(Job.sweep_id.in_(ended), Job.state.in_(_LIVE_JOB_STATES))
    return session.scalars(q).all()


def epoch_values(
    session: Session, job_ids: Sequence[int], name: str, after_epoch: int = 0
) -> list[tuple[int, int, int, int, float]]:
    """``(job_id, attempt, rank, epoch, value)`` of the per-epoch records named ``name`` of
    ``job_ids`` with ``epoch > after_epoch``; non-finite values as floats."""
    if not job_ids:
        return []
    m = MetricRecord
    q = select(m.job_id, m.attempt, m.rank, m.epoch, m.value, m.nonfinite).where(
        m.job_id.in_(job_ids), m.name == name, m.step == EPOCH_STEP, m.epoch > after_epoch,
    )
    return [
        (j, a, r, e, decode_value(nf) if nf else float(v))
        # Core rows, not ORM ones (as service.store.series): a 200-trial sweep is 100k rows.
        for j, a, r, e, v, nf in session.connection().execute(q).tuples().all()
    ]

