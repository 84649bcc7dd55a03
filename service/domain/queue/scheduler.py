"""Queue policy: which queued jobs start now, and why the others wait. Pure: no I/O, no clock.

Order: higher ``priority`` first, then submission order (job id). Gang allocation: a job gets
every resource it asks for at once, or nothing.

Anti-starvation is EASY backfill with a reservation, per resource kind (GPUs, CPU slots):

* The first job in order that does not fit gets a **reservation**: the time its resources will
  be free (the *shadow time*), computed from the running jobs' deadlines (``max_runtime_s``:
  a job cannot run past it), and the resources that will still be spare at that time.
* A job behind it may start now only if it fits now **and** either it is guaranteed to end by
  the shadow time (its own ``max_runtime_s``) or it only uses the spare resources. So a large
  job at the head is never delayed by the small ones that overtake it.
* Jobs without ``max_runtime_s`` have no bound, so behind a reservation they start only on
  spare resources; so does everything when the shadow time is unknown (a running job without a
  deadline holds what the reserved job needs). With no deadlines anywhere this is strict
  head-of-line per kind.
* A job of another kind (a CPU job behind a blocked GPU job) is not affected.

With teams (a :class:`service.domain.queue.quota.TeamBook`), the order is fair share first
(lowest factor, then priority, then id), a job its team's budget or quota holds waits without
a reservation (it could not use one), and a preemptible job past its team's quota starts only
on idle slots and reserves none (it borrows): borrowers are considered after every other job,
so they take only what jobs within their quota leave. The reservation goes to the first job in that
order that waits for capacity alone: no job starves. Every waiting job's reason names the rule
that holds it: capacity, quota, budget, fair share or a reservation.
"""

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cache
from itertools import chain
from typing import NamedTuple

from service.domain.queue.quota import TeamBook, whose

GPU, CPU = "gpu", "cpu"
UNIT = {GPU: ("GPU", "GPUs"), CPU: ("CPU slot", "CPU slots")}


@dataclass(frozen=True)
class QueuedJob:
    id: int
    priority: int
    kind: str  # GPU or CPU
    count: int
    max_runtime_s: float | None
    team: str | None = None
    preemptible: bool = False


@dataclass(frozen=True)
class RunningJob:
    id: int
    kind: str
    count: int
    ends_by: float  # absolute time by which it must have ended (math.inf: no deadline)


@dataclass(frozen=True)
class Launch:
    job_id: int
    resources: list[str]


class Waiting(NamedTuple):
    """A queued job's place and why it waits. A tuple: a pass makes one per queued job
    (10,000 of them), and a tuple is made several times faster than a frozen dataclass."""

    position: int  # 1-based place among the jobs that stay queued, in queue order
    reason: str


@dataclass
class Plan:
    launches: list[Launch] = field(default_factory=list)
    waiting: dict[int, Waiting] = field(default_factory=dict)
    # Per kind, the first job in order that waits for capacity alone (no team rule holds it,
    # it borrows nothing): the one that may preempt or reclaim (``service.domain.loop.scheduling``).
    heads: dict[str, QueuedJob] = field(default_factory=dict)


@dataclass
class _Reservation:
    job_id: int
    shadow_time: float
    spare: int  # resources of this kind still free at shadow_time after the reserved job starts


def queue_order(jobs: Iterable[QueuedJob]) -> list[QueuedJob]:
    """Higher priority first, then FIFO."""
    return sorted(jobs, key=lambda j: (-j.priority, j.id))


def _count(n: int, kind: str) -> str:
    singular, plural = UNIT[kind]
    return f"{n} {singular if n == 1 else plural}"


@cache
def _need(count: int, kind: str, free: int) -> str:
    """``needs 2 CPU slots; 1 free``: most waiting jobs of a pass share a few of these."""
    return f"needs {_count(count, kind)}; {free} free"


def _reserve(job: QueuedJob, free: int, running: list[RunningJob], now: float) -> _Reservation:
    """When will ``job`` fit, given the running jobs' deadlines, and what is spare then."""
    available = free
    for r in sorted((r for r in running if r.kind == job.kind), key=lambda r: r.ends_by):
        if available >= job.count:
            break
        available += r.count
        shadow = r.ends_by
        if available >= job.count:
            return _Reservation(job.id, max(shadow, now), available - job.count)
    if available >= job.count:  # fits already (not reached by plan(); kept total)
        return _Reservation(job.id, now, available - job.count)
    return _Reservation(job.id, math.inf, 0)


def plan(
    queue: Sequence[QueuedJob],
    free: dict[str, list[str]],
    running: Sequence[RunningJob],
    now: float,
    teams: TeamBook | None = None,
) -> Plan:
    """Decide launches for one scheduling pass.

    ``free`` maps a kind to its free resource names (in allocation order); ``running`` are the
    jobs holding resources, with their deadlines; ``teams``: quotas, budgets and fair share
    (None: none, priority then FIFO). Returns the jobs to launch now, with the resources each
    gets, and for every other queued job its queue position and why it waits.
    """
    free = {kind: list(names) for kind, names in free.items()}
    running = list(running)
    reservations: dict[str, _Reservation] = {}
    reserved_team: dict[str, str | None] = {}
    started_by: dict[str, QueuedJob] = {}  # per kind, the last job this pass started
    result = Plan()
    waiting = result.waiting
    reasons: dict[tuple[str, str | None, int], str] = {}  # (need, team, job ahead) → reason
    position = 0  # among the jobs that stay queued
    if teams is None:
        order, limited = queue_order(queue), frozenset[str | None]()
    else:
        factor = teams.factor
        order = sorted(queue, key=lambda j: (factor.get(j.team, 0.0), -j.priority, j.id))
        limited = frozenset((*teams.spent, *teams.max_slots))  # teams a rule may hold
    # Borrowers go after every job within its quota, whatever their factor: idle slots are
    # what those leave (else a borrower of a team low in usage took the slot a reclaim freed).
    deferred: list[QueuedJob] = []
    deferred_ids: set[int] = set()
    for job in chain(order, deferred):  # deferred: read once ``order`` is done, filled meanwhile
        borrowing = False
        if job.team in limited and teams is not None:
            held_by = teams.hold(job.team, job.count, job.preemptible)
            if held_by is not None:
                position += 1
                waiting[job.id] = Waiting(position, held_by)
                continue
            # (one that is not preemptible and past the quota was held just now)
            borrowing = job.preemptible and teams.borrowing(job.team, job.count)
            if borrowing and job.id not in deferred_ids:
                deferred_ids.add(job.id)
                deferred.append(job)
                continue
        pool = free.setdefault(job.kind, [])
        fits = len(pool) >= job.count
        reservation = reservations.get(job.kind)
        if reservation is not None and fits:
            ends_by = now + job.max_runtime_s if job.max_runtime_s is not None else math.inf
            if ends_by <= reservation.shadow_time < math.inf:
                pass  # done before the reserved job can start: harmless
            elif job.count <= reservation.spare:
                reservation.spare -= job.count
            else:
                position += 1
                ahead = (f"job {reservation.job_id} (ahead in the queue)"
                         if teams is None or reserved_team[job.kind] == job.team
                         else f"{whose(reserved_team[job.kind], reservation.job_id)} "
                         "(ahead by fair share)")
                waiting[job.id] = Waiting(
                    position, f"{_need(job.count, job.kind, len(pool))}, held for {ahead}")
                continue
        if fits:
            taken, free[job.kind] = pool[: job.count], pool[job.count :]
            result.launches.append(Launch(job.id, taken))
            ends_by = now + job.max_runtime_s if job.max_runtime_s is not None else math.inf
            running.append(RunningJob(job.id, job.kind, job.count, ends_by))
            if teams is not None:
                teams.took(job.team, job.count)
                started_by[job.kind] = job
            continue
        position += 1
        need = _need(job.count, job.kind, len(pool))
        if borrowing:  # past its quota: idle slots only, and no reservation for a borrower
            cap = teams.max_slots.get(job.team or "") if teams is not None else None
            waiting[job.id] = Waiting(
                position, f"{need}; past team {job.team}'s {cap} slots it may only borrow "
                "idle ones")
            continue
        if reservation is None:
            reservations[job.kind] = _reserve(job, len(pool), running, now)
            reserved_team[job.kind] = job.team
            result.heads[job.kind] = job
            before = started_by.get(job.kind)
            if before is not None and before.team != job.team:
                need = f"{need}, behind {whose(before.team, before.id)} by fair share"
            waiting[job.id] = Waiting(position, need)
            continue
        key = (need, job.team, reservation.job_id)
        reason = reasons.get(key)
        if reason is None:
            ahead_team = reserved_team[job.kind]
            reason = reasons[key] = (
                f"{need}, behind {whose(ahead_team, reservation.job_id)} by fair share"
                if teams is not None and ahead_team != job.team
                else f"{need}, behind job {reservation.job_id}")
        waiting[job.id] = Waiting(position, reason)
    return result
