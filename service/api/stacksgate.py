"""How many ``GET /jobs/{id}/stacks`` calls may wait at once: per job and in all, per process.

A call that takes stacks now waits for the job's attempt loop, a process the job controls: a job can
stop it (SIGSTOP; its pid is in the run directory's claim file), and then every call waits its
whole deadline (``service.domain.files.stackrequest.STACKS_WAIT_S``). The wait holds no thread
(the route awaits it on the event loop), and at most ``TORCHYARD_STACKS_PER_JOB`` calls for one
job and ``TORCHYARD_STACKS_IN_FLIGHT`` in all wait at once: one more is refused at once (429)
with ``Retry-After``, the seconds until the first call in its way has ended at the latest.
Before these bounds, 50 calls for one stopped attempt loop held all 40 of the thread pool's threads
for 15 s each, and every other route of the API waited behind them (issue 44, item 6).

Used on the event loop only (the route is async), so it needs no lock; each ``serve --workers``
process has its own.
"""

import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field


class StacksBusy(Exception):
    """Too many stacks calls wait already; ``retry_after_s`` says when to try again."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


@dataclass
class StacksGate:
    per_job: int
    in_flight: int
    _deadlines: dict[int, list[float]] = field(default_factory=dict)  # job → its calls' ends

    @contextmanager
    def slot(self, job_id: int, wait_s: float) -> Iterator[None]:
        """Hold one of the slots while a call for ``job_id`` waits (at most ``wait_s``);
        ``StacksBusy`` when none is free."""
        now = time.monotonic()
        mine = self._deadlines.get(job_id, [])
        every = [end for ends in self._deadlines.values() for end in ends]
        if len(mine) >= self.per_job:
            raise StacksBusy(f"{len(mine)} stacks calls for job {job_id} are waiting already "
                             f"(TORCHYARD_STACKS_PER_JOB={self.per_job})", _retry_after(mine, now))
        if len(every) >= self.in_flight:
            raise StacksBusy(f"{len(every)} stacks calls are waiting already "
                             f"(TORCHYARD_STACKS_IN_FLIGHT={self.in_flight})",
                             _retry_after(every, now))
        end = now + wait_s
        self._deadlines.setdefault(job_id, []).append(end)
        try:
            yield
        finally:
            ends = self._deadlines[job_id]
            ends.remove(end)
            if not ends:
                del self._deadlines[job_id]


def _retry_after(ends: list[float], now: float) -> int:
    """Whole seconds until the first of ``ends`` (at least 1)."""
    return max(1, math.ceil(min(ends) - now))
