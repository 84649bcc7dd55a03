"""Preemption by priority: which running jobs to pause so a more urgent one can start. Pure.

After a scheduling pass (``service.domain.queue.scheduler``), the first waiting job of each
resource kind in queue order may preempt. It does when its resources will not come free by
themselves soon (free now plus what jobs already pausing hold is too little) and pausing
preemptible jobs of strictly lower priority of its own team makes enough room (priority orders
a team's own jobs; between teams, slots go back only by reclaim: ``service.domain.queue.reclaim``). A job preempted before is safe
for ``min_run_s`` after each start (no thrashing: it makes progress between preemptions). Those are taken lowest priority first, then the most recently
started first, until there is room; none are taken when all of them would not make enough.
The supervisor then pauses them (``service.domain.loop.pauses``) and resumes them on its own once
they are paused: they wait in the queue again, ahead of later jobs of their priority.
"""

from collections.abc import Sequence
from dataclasses import dataclass

from service.domain.queue.scheduler import QueuedJob, queue_order


@dataclass(frozen=True)
class ActiveJob:
    """A job holding resources: what preemption needs to know of it."""

    id: int
    priority: int
    kind: str
    count: int
    started_at: float  # Unix time of its latest start
    preemptible: bool
    pausing: bool  # being paused already: its resources come free soon
    preempted_before: bool = False  # then safe for min_run_s after each start
    team: str | None = None

    def may_be_preempted(self, min_run_s: float, now: float) -> bool:
        """Preemptible, not pausing already, and not inside its minimum run time."""
        return self.preemptible and not self.pausing and (
            not self.preempted_before or now - self.started_at >= min_run_s)


@dataclass(frozen=True)
class Preemption:
    for_job: int
    victims: tuple[int, ...]


def choose(
    waiting: Sequence[QueuedJob], free: dict[str, int], active: Sequence[ActiveJob],
    min_run_s: float, now: float,
) -> list[Preemption]:
    """At most one preemption per kind. ``waiting``: the queued jobs a pass left waiting;
    ``free``: per kind, the resources still free after its launches."""
    decisions: list[Preemption] = []
    seen: set[str] = set()
    for job in queue_order(waiting):
        if job.kind in seen:
            continue
        seen.add(job.kind)
        room = free.get(job.kind, 0) + sum(
            a.count for a in active if a.kind == job.kind and a.pausing)
        if room >= job.count:
            continue  # room is coming: a pause under way, or a job ending
        eligible = sorted(
            (a for a in active
             if a.kind == job.kind and a.team == job.team and a.priority < job.priority
             and a.may_be_preempted(min_run_s, now)),
            key=lambda a: (a.priority, -a.started_at),
        )
        victims: list[int] = []
        for candidate in eligible:
            victims.append(candidate.id)
            room += candidate.count
            if room >= job.count:
                decisions.append(Preemption(job.id, tuple(victims)))
                break
    return decisions
