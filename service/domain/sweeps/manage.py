"""Sweeps as the routes see them: create (checked like a job submission), cancel, read (trials
with their outcome and objective per epoch, counts, the best trial), and the sweep's record of a
trial whose job is about to be deleted.

Creating a sweep stores its request and wakes the supervisor; the trials are made by the sweep
driver (``service.domain.sweeps.driver``) in the acting supervisor, never here. A sweep's trials,
counts and best are read from its own record (``sweep_trials``) joined with the trials' jobs: a
trial whose job was deleted keeps its number, parameters, outcome, value and reason (copied by
:meth:`Sweeps.settle` before the job's rows go), so deleting trials' jobs changes neither how many
trials the sweep made nor its counts nor its best; only the per-epoch values go with the job's
records.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass

from pydantic import ValidationError
from sqlalchemy.orm import Session, sessionmaker

from service.domain.identity.caller import ADMIN, Caller, acting_for
from service.domain.intake.admission import AdmissionRefused
from service.domain.intake.submission import Intake, SubmitRejected
from service.domain.sweeps.outcome import final_value, outcome, trial_epochs
from service.domain.sweeps.spec import SweepSpec, extremes
from service.domain.tracking import enrolment as tracking
from service.store import repository as repo
from service.store import sweeps as store
from service.store.tables import Sweep, SweepTrial
from torchyard_contract.confinement import PathRefused
from torchyard_contract.spec import JobSpec
from torchyard_contract.state import TERMINAL_STATES, JobState, SweepState, TrialOutcome


@dataclass(frozen=True)
class TrialView:
    job_id: int
    params: dict
    state: str  # the job's; a deleted one's when it was deleted
    outcome: str | None
    value: float | None
    epochs: dict[int, float]
    reason: str | None
    deleted: bool = False


@dataclass(frozen=True)
class SweepView:
    sweep: Sweep
    trials: list[TrialView]

    @property
    def counts(self) -> dict[str, int]:
        counts = {"queued": 0, "running": 0, "completed": 0, "pruned": 0, "failed": 0,
                  "cancelled": 0}
        for t in self.trials:
            key = t.outcome or ("queued" if t.state == JobState.queued.value else "running")
            counts[key] += 1
        return counts

    @property
    def best(self) -> TrialView | None:
        spec = SweepSpec.model_validate(self.sweep.spec)
        done = [t for t in self.trials
                if t.outcome == "completed" and t.value is not None and math.isfinite(t.value)]
        if not done:
            return None
        pick = min if spec.objective.mode == "min" else max
        return pick(done, key=lambda t: t.value)  # type: ignore[arg-type,return-value]


def view(session: Session, sweep: Sweep) -> SweepView:
    """The sweep with every trial it made, from its record and the trials' jobs that remain."""
    spec = SweepSpec.model_validate(sweep.spec)
    records = store.trial_records(session, sweep.id)
    jobs = {j.id: j for j in store.trials(session, sweep.id)}
    epochs = trial_epochs(session, spec.objective, list(jobs.values()))
    trials = []
    for record in records:
        job = None if record.state is not None else jobs.get(record.job_id)
        if job is None:
            trials.append(_deleted(record))
            continue
        trials.append(TrialView(
            job_id=job.id, params=dict(record.params), state=job.state, outcome=outcome(job),
            value=final_value(job, epochs[job.id]), epochs=epochs[job.id], reason=job.reason,
        ))
    return SweepView(sweep, trials)


def _deleted(record: SweepTrial) -> TrialView:
    """A trial whose job was deleted, as the sweep recorded it then."""
    return TrialView(
        job_id=record.job_id, params=dict(record.params),
        state=record.state or JobState.cancelled.value, outcome=record.outcome or TrialOutcome.cancelled,
        value=record.value, epochs={}, reason=record.reason, deleted=True,
    )


class SweepRejected(Exception):
    """A sweep valid on its own that this server cannot run (``kind``, ``status`` as for
    ``service.domain.intake.submission.SubmitRejected``); ``field`` names what was refused
    (``spec.<field>`` for a check of the base job spec)."""

    def __init__(self, kind: str, message: str, status: int = 422, field: str = "spec") -> None:
        super().__init__(message)
        self.kind, self.status, self.field = kind, status, field

    @classmethod
    def of_spec(cls, kind: str, message: str, status: int) -> "SweepRejected":
        """A refusal of the base job spec: its ``field: why`` as ``spec.field: why``."""
        field, sep, why = message.partition(": ")
        if not sep or not field.replace("_", "").replace(".", "").isalnum():
            return cls(kind, f"spec: {message}", status)
        return cls(kind, f"spec.{field}: {why}", status, f"spec.{field}")


@dataclass
class Sweeps:
    sessions: sessionmaker[Session]
    intake: Intake
    changed: Callable[[], None]  # wakes the supervisor's loop

    def create(self, spec: SweepSpec, caller: Caller = ADMIN) -> Sweep:
        """Store a running sweep of ``caller`` (its trials are its owner's and team's). Raises :class:`SweepRejected` for a grid over the bound
        (``space``) and for whatever ``POST /jobs`` would refuse of the base spec or of the spec
        at each end of the space's dimensions (``spec.<field>``, the status a job would get)."""
        if (why := spec.grid_refused()) is not None:
            raise SweepRejected("invalid_request", why, field="space")
        with self.sessions() as session:
            try:
                # its team's limits as its trials will meet them (made as a member), then every
                # check of POST /jobs
                self.intake.check_team(spec.spec, acting_for(caller.user, caller.team))
                base = self.intake.vet(session, spec.spec, caller).spec
                for key, dim in spec.space.items():  # every spec field set, at its bounds
                    if spec.sets_field(key):
                        for value in extremes(dim):
                            self.intake.check_runnable(JobSpec.model_validate(
                                {**base.model_dump(mode="json"), key: value}), caller)
            except SubmitRejected as exc:
                raise SweepRejected.of_spec(exc.kind, str(exc), exc.status) from exc
            except PathRefused as exc:
                raise SweepRejected.of_spec("invalid_request", str(exc), 422) from exc
            except AdmissionRefused as exc:
                raise SweepRejected.of_spec("forbidden", str(exc), 403) from exc
            spec = spec.model_copy(update={"spec": base})
            sweep = store.create_sweep(
                session, spec.name, spec.spec.priority, spec.model_dump(mode="json"),
                owner=caller.user, team=caller.team)
            tracking.enrol_sweep(session, self.intake.settings, sweep, spec.spec)
            session.commit()
            session.refresh(sweep)
        self.changed()
        return sweep

    def cancel(self, sweep_id: int) -> Sweep | None:
        """running → cancelled, and its queued and running trials with it (the supervisor stops
        their groups). A sweep already ended is returned unchanged; None if there is none."""
        with self.sessions() as session:
            if store.get_sweep(session, sweep_id) is None:
                return None
            store.end_sweep(session, sweep_id, SweepState.cancelled, "cancelled by user")
            for job in store.trials(session, sweep_id):
                repo.transition(session, job.id, JobState.cancelled,
                                reason=f"sweep {sweep_id} cancelled")
            session.commit()
            sweep = store.get_sweep(session, sweep_id)
        self.changed()
        return sweep

    def settle(self, session: Session, job_id: int) -> None:
        """Before a terminal job is deleted: if it is a sweep's trial, copy how it ended (outcome,
        value, state, reason) into the sweep's record, in the caller's transaction, which must
        commit before the job's records go (``service.domain.files.cleanup``)."""
        job = repo.get_job(session, job_id)
        if job is None or job.sweep_id is None or JobState(job.state) not in TERMINAL_STATES:
            return
        record = store.trial_record(session, job.sweep_id, job_id)
        sweep = store.get_sweep(session, job.sweep_id)
        if record is None or record.state is not None or sweep is None:
            return
        try:
            spec = SweepSpec.model_validate(sweep.spec)
        except ValidationError:  # a request stored by an older server: its outcome still counts
            value = None
        else:
            value = final_value(job, trial_epochs(session, spec.objective, [job])[job.id])
        store.settle_trial(
            session, job.sweep_id, record.number, outcome=outcome(job) or TrialOutcome.cancelled,
            value=value if value is not None and math.isfinite(value) else None,
            state=job.state, reason=job.reason,
        )
