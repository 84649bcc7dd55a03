"""What the supervisor's parts share: the settings, the stores, the executor and the lease they
act through, and the jobs this process watches.

The supervisor (``service.domain.loop.supervisor``) builds one :class:`LoopContext` and hands it to its
parts (intake, launch, scheduling, reaping, stops, recovery); each part reads and changes only
what its docstring names. Everything here is touched from the supervisor's thread, except
``watched.refs`` which the stop threads read.
"""

from collections.abc import Callable
from dataclasses import dataclass, field

from sqlalchemy.orm import Session, sessionmaker

from service.domain.lease import Lease
from service.domain.queue import scheduler
from service.domain.queue.inventory import Inventory
from service.executor.base import Executor
from service.settings import Settings


@dataclass
class Watched:
    """The jobs whose processes the executor runs for this process, in this lease term."""

    # Job id → the executor's opaque reference.
    refs: dict[int, str] = field(default_factory=dict)
    # Jobs whose group is being stopped (a cancel, a guard's failure).
    stopping: set[int] = field(default_factory=set)
    # Executor-queued jobs already moved out of ``queued`` (a tick writes only what changed).
    seen_started: set[int] = field(default_factory=set)
    # Jobs seen ended whose exit.json is not visible yet: job id → first seen (monotonic).
    awaiting_outcome: dict[int, float] = field(default_factory=dict)
    # Pausing jobs whose attempt loop was asked to pause (service.domain.loop.pauses).
    told_to_pause: set[int] = field(default_factory=set)

    def forget(self, job_id: int) -> None:
        self.refs.pop(job_id, None)
        self.stopping.discard(job_id)
        self.seen_started.discard(job_id)
        self.awaiting_outcome.pop(job_id, None)
        self.told_to_pause.discard(job_id)

    def clear(self) -> None:
        self.refs.clear()
        self.stopping.clear()
        self.seen_started.clear()
        self.awaiting_outcome.clear()
        self.told_to_pause.clear()


@dataclass
class LoopContext:
    settings: Settings
    # Writers for the routes' calls and the finisher (they may wait for a lock).
    sessions: sessionmaker[Session]
    # Writers of the loop, with a short lock wait: a busy database fails the step, which runs
    # again on the next pass (the loop never stalls behind a lock).
    loop_sessions: sessionmaker[Session]
    # Read-only sessions: a scheduling pass reads the queue without holding the write lock.
    read_sessions: sessionmaker[Session]
    inventory: Inventory
    executor: Executor
    lease: Lease
    api_url: str
    # Call when the queue or free resources changed: wakes the loop for a scheduling pass.
    queue_changed: Callable[[], None]
    # The result of the last scheduling pass (local) or of the executor's queue: queued job id
    # → position and reason. Replaced whole, never mutated (routes read it from other threads).
    set_waiting: Callable[[dict[int, scheduler.Waiting]], None]
    watched: Watched = field(default_factory=Watched)
