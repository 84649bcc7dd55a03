"""Reclaim: which borrowed jobs to pause so a job of a team within its quota can start. Pure.

A team holding more than its ``max_slots`` runs the excess on *borrowed* slots, always with
``preemptible`` jobs (``service.domain.queue.quota``). Its borrowed jobs are its preemptible
ones, most recently started first, as many as make up the excess (slots already pausing are
leaving and count off it first).

When the first job of a kind that waits for capacity (``Plan.heads``) is within its team's
quota and its slots will not come free by themselves (free now plus what is already pausing is
too little), the fewest borrowed jobs of other teams whose slots make enough room are paused —
among equally few, the most recently started — and none when all of them would not be enough.
A job preempted before is safe for ``min_run_s`` after each start, as for a priority
preemption. The supervisor pauses them (checkpoint first) and queues them again once paused:
they say ``paused to return 2 slots to team nlp`` while they wait.
"""

from collections.abc import Mapping, Sequence
from itertools import combinations

from service.domain.queue.preemption import ActiveJob, Preemption
from service.domain.queue.scheduler import QueuedJob

# Above this many candidates the fewest are not searched for: newest first until enough.
EXACT_SEARCH_MAX = 16


def borrowed(active: Sequence[ActiveJob], max_slots: Mapping[str, int]) -> list[ActiveJob]:
    """The jobs running on borrowed slots, over every team with a ``max_slots``."""
    by_team: dict[str, list[ActiveJob]] = {}
    for job in active:
        if job.team is not None and job.team in max_slots:
            by_team.setdefault(job.team, []).append(job)
    found = []
    for team, jobs in by_team.items():
        excess = sum(j.count for j in jobs if not j.pausing) - max_slots[team]
        for job in sorted((j for j in jobs if j.preemptible and not j.pausing),
                          key=lambda j: -j.started_at):
            if excess <= 0:
                break
            found.append(job)
            excess -= job.count
    return found


def held_by(team: str | None, active: Sequence[ActiveJob]) -> int:
    return sum(j.count for j in active if j.team == team)


def choose(
    head: QueuedJob, free: int, active: Sequence[ActiveJob], max_slots: Mapping[str, int],
    min_run_s: float, now: float,
) -> Preemption | None:
    """The borrowed jobs to pause for ``head`` (``free``: its kind's slots free after the pass),
    or None."""
    cap = max_slots.get(head.team) if head.team is not None else None
    if cap is not None and held_by(head.team, active) + head.count > cap:
        return None  # past its own quota: it may borrow idle slots, never take them back
    room = free + sum(a.count for a in active if a.kind == head.kind and a.pausing)
    if room >= head.count:
        return None  # room is coming: a pause under way, or free already
    candidates = sorted(
        (a for a in borrowed(active, max_slots)
         if a.kind == head.kind and a.team != head.team and a.may_be_preempted(min_run_s, now)),
        key=lambda a: -a.started_at)
    need = head.count - room
    if sum(a.count for a in candidates) < need:
        return None
    if len(candidates) > EXACT_SEARCH_MAX:
        victims: list[ActiveJob] = []
        for candidate in candidates:
            victims.append(candidate)
            if sum(v.count for v in victims) >= need:
                break
        return Preemption(head.id, tuple(v.id for v in victims))
    for size in range(1, len(candidates) + 1):
        # Index order is newest first: the first set that is enough prefers the newest.
        for combo in combinations(candidates, size):
            if sum(a.count for a in combo) >= need:
                return Preemption(head.id, tuple(a.id for a in combo))
    return None
