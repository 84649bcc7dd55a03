"""Which records a job may have: ranks ``0 .. world size - 1`` and attempts that exist.

One rule for both ways a record arrives: a rank's POST (``service.api.routes.records``) and the spool
files re-ingested when the job ends (``service.domain.records.spool``). A job's token is shared by its ranks, so
a forged record can only be refused by what it names: a rank the job does not have, an attempt
that has not started (it would later shadow the genuine record as a "duplicate"), or a job that
is over (docs/metrics.md: no record is stored once a job is terminal).
"""

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from torchyard_contract.attempts import AttemptBudget, spec_world_size
from torchyard_contract.rundir import RunDir
from torchyard_contract.runfiles import read_attempts
from torchyard_contract.state import ACTIVE_STATES, JobState


def job_attempts(run: RunDir, spec: dict | None, pauses: int = 0) -> list[dict]:
    """The attempt records the job's run directory holds, within its limits (attempts: its
    restart budget, ``torchyard_contract.attempts``; ranks)."""
    return read_attempts(run, AttemptBudget.of_spec(spec, pauses).attempts_max,
                         spec_world_size(spec))


class JobFacts(Protocol):
    """What the record rules read of a job: the ORM ``Job``, or the plain row of
    ``service.store.records.job_for_records`` (cheaper, on the hot path)."""

    @property
    def id(self) -> int: ...
    @property
    def state(self) -> str: ...
    @property
    def spec(self) -> Any: ...
    @property
    def attempts(self) -> Any: ...
    @property
    def first_metric_at(self) -> datetime | None: ...


@dataclass(frozen=True)
class Refusal:
    status: int  # 409 over, 422 no such rank/attempt, 503 the next attempt, not recorded yet
    field: str
    message: str


@dataclass(frozen=True)
class RecordScope:
    """The ranks and attempts a job has now. Attempts: before any is recorded only attempt 1
    can be running (a job token exists only from launch); after that the recorded ones, and the
    next one only once the latest has ended (503: the supervisor records it within a tick)."""

    job_id: int
    ranks: int
    attempts: frozenset[int]
    latest_ended: bool
    active: bool

    @classmethod
    def of(cls, job: JobFacts) -> "RecordScope":
        recorded: dict[int, dict] = {}
        for a in job.attempts or []:
            if isinstance(a, dict) and isinstance(a.get("number"), int):
                recorded[a["number"]] = a
        latest = max(recorded, default=0)
        return cls(
            job_id=job.id,
            ranks=spec_world_size(job.spec),
            attempts=frozenset(recorded) or frozenset({1}),
            latest_ended=bool(latest) and recorded[latest].get("ended_at") is not None,
            active=JobState(job.state) in ACTIVE_STATES,
        )

    def refusal(self, rank: int, attempt: int, where: str = "") -> Refusal | None:
        """Why a record of ``rank``/``attempt`` may not be stored now; None when it may."""
        if not self.active:
            return Refusal(409, "", f"job {self.job_id} is over: records after its end are "
                           "not stored (the rank's spool file keeps them)")
        if rank >= self.ranks:
            return Refusal(422, f"{where}rank", f"job {self.job_id} has ranks "
                           f"0..{self.ranks - 1}; got {rank}")
        if attempt in self.attempts:
            return None
        if self.latest_ended and attempt == max(self.attempts) + 1:
            return Refusal(503, f"{where}attempt",
                           f"job {self.job_id}: attempt {attempt} has not started yet; retry")
        known = ", ".join(map(str, sorted(self.attempts)))
        return Refusal(422, f"{where}attempt",
                       f"job {self.job_id} has attempts {known}; got {attempt}")
