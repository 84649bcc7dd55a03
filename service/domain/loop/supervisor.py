"""The supervisor owns jobs' lives and every state change after submission.

One background thread runs ``tick()``, each step a part of its own: fail jobs a loss guard asked
to stop and stop the groups of cancelled and failed jobs (``service.domain.loop.stops``), ask pausing
jobs' attempt loops to pause (``service.domain.loop.pauses``), reap finished
ones and mark started ones running (``service.domain.loop.reaping``: resources are freed at once;
``service.domain.loop.finisher`` re-ingests their spools and makes them terminal on a thread of its
own), then advance the sweeps (``service.domain.sweeps.driver``: new trials, pruning), then run a
scheduling pass (``service.domain.loop.scheduling``: priority, FIFO, gang allocation, backfill behind a
reservation; launches through ``service.domain.loop.launch``). The webhook outbox is sent by
``service.domain.webhooks.delivery`` on threads of its own; every job's records go to MLflow and
TensorBoard through ``service.domain.tracking.exporter``, likewise. Submissions go through
``service.domain.intake.submission``; each lease term starts with ``service.domain.loop.recovery``. Each step,
and each job within a step, is isolated: whatever one job left in its run directory cannot stop
the loop. It is the only code that allocates resources, so two jobs never share one. Routes call
``submit``, ``cancel``, ``pause``, ``resume``, ``queue_status`` and ``resources``.

Every server process has a supervisor, but only the holder of the lease (``service.domain.lease``)
acts: it recovers at the start of each term, ticks while ``held()``, and writes its state
changes (its finisher's too) under the lease's fence. The others stand by (their routes still
serve).

The loop's own writes wait at most ``LOOP_LOCK_TIMEOUT_S`` for a database lock (a request, or a
paused process, may hold it): a step that meets a busy database (``service.store.db.is_busy``) runs
again on the next pass, so the loop never stalls behind a lock (docs/operations.md).
"""

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from sqlalchemy.orm import Session, sessionmaker

from service.domain.files.cleanup import Cleanup
from service.domain.identity.caller import ADMIN, Caller
from service.domain.intake.submission import Intake
from service.domain.lease import Lease
from service.domain.loop.context import LoopContext
from service.domain.loop.finisher import Finisher
from service.domain.loop.launch import RunStarter
from service.domain.loop.pauses import Pauses
from service.domain.loop.reaping import Reaper, open_executor_run
from service.domain.loop.recovery import Recovery
from service.domain.loop.scheduling import ExecutorQueueing, HostScheduling, Scheduling
from service.domain.loop.stops import Stops
from service.domain.queue import scheduler
from service.domain.queue.inventory import Inventory
from service.domain.queue.snapshot import PUBLISH_MIN_S, SnapshotReader, encode
from service.domain.sweeps.driver import SweepDriver
from service.domain.sweeps.manage import Sweeps, view
from service.domain.tracking.exporter import Exporter
from service.domain.webhooks.delivery import Dispatcher
from service.executor.base import Executor, NodeRow
from service.settings import Settings
from service.store import identity as identitystore
from service.store import queue as queuerepo
from service.store import repository as repo
from service.store import sweeps as sweepstore
from service.store.db import is_busy
from service.store.tables import Job, Sweep
from torchyard_contract.spec import JobSpec
from torchyard_contract.state import JobState

logger = logging.getLogger(__name__)

# A scheduling pass runs when the queue or free resources change, and at least this often.
REPLAN_S = 2.0
# How long an idle loop (the last pass found no unfinished job and no running sweep) sleeps
# unless woken: a submit, cancel or ended group in this process wakes it at once; a job
# submitted through another ``--workers`` process is seen within this (PostgreSQL or SQLite).
IDLE_POLL_S = 1.0
# Longest the loop's own writes wait for a database lock (a request may hold it, or a paused
# process): then the step fails and runs again on the next pass, so the loop never stalls.
LOOP_LOCK_TIMEOUT_S = 1.0


@dataclass
class Supervisor:
    """The routes' entry to the domain and the loop that runs its parts; see the module
    docstring. Its parts share one :class:`service.domain.loop.context.LoopContext`."""

    settings: Settings
    # Writers for the routes' calls (``submit``, ``cancel``) and the finisher.
    session_factory: sessionmaker[Session]
    inventory: Inventory
    executor: Executor
    api_url: str = ""
    # Read-only sessions (``service.store.db``): a scheduling pass reads the queue without holding the
    # write lock; None = use ``session_factory``.
    read_session_factory: sessionmaker[Session] | None = None
    # Writers of the loop and the lease, with a short lock wait (``LOOP_LOCK_TIMEOUT_S``,
    # ``service.store.db.with_lock_timeout``); None = use ``session_factory``.
    loop_session_factory: sessionmaker[Session] | None = None
    # Who supervises (``service.domain.lease``); built from the settings when not given.
    lease: Lease | None = None
    # What the queue snapshot's intervals are measured on (its publishing and its reads).
    clock: Callable[[], float] = time.monotonic
    _stop: threading.Event = field(default_factory=threading.Event)
    _wake: threading.Event = field(default_factory=threading.Event)
    # Last scheduling pass of this term: queued job id → position and reason; None before the
    # term's first pass. Replaced whole, never mutated, so routes can read it from other threads.
    _waiting: dict[int, scheduler.Waiting] | None = None
    # What this term last wrote to the queue snapshot (service.domain.queue.snapshot), and when.
    _published: dict[int, scheduler.Waiting] | None = None
    _published_at: float = -math.inf
    _queue_dirty: bool = True
    _was_idle: bool = False  # the last pass was idle (``_idle``): sleep ``IDLE_POLL_S``
    _last_plan: float = 0.0
    _thread: threading.Thread | None = None
    # The lease generation this process last recovered under; None = not acting.
    _term: int | None = None

    def __post_init__(self) -> None:
        loop_sessions = self.loop_session_factory or self.session_factory
        if self.lease is None:
            self.lease = Lease(loop_sessions, self.settings.lease_ttl_s)
        self.ctx = LoopContext(
            settings=self.settings, sessions=self.session_factory, loop_sessions=loop_sessions,
            read_sessions=self.read_session_factory or self.session_factory,
            inventory=self.inventory, executor=self.executor, lease=self.lease,
            api_url=self.api_url, queue_changed=self._queue_changed, set_waiting=self._set_waiting,
        )
        # Ended jobs are finished (spools re-ingested, terminal state) off this loop's thread,
        # under the lease: a deposed supervisor's finisher writes nothing.
        self.finisher = Finisher(
            runs_dir=self.settings.runs_dir,
            session_factory=self.session_factory,
            max_records_per_rank=self.settings.spool_ingest_max_records,
            on_finished=self._queue_changed,
            fence=self.lease.fence,
            excludes_nodes=self.executor.excludes_nodes,
            opened=open_executor_run,
        )
        self.intake = Intake(self.settings, self.session_factory, self.inventory,
                             self.executor.queues_jobs, self._queue_changed,
                             read_sessions=self.ctx.read_sessions)
        starter = RunStarter(self.ctx)
        self.pauses = Pauses(self.ctx)
        self.scheduling: Scheduling = (
            ExecutorQueueing(self.ctx, starter) if self.executor.queues_jobs
            else HostScheduling(self.ctx, starter, self.pauses)
        )
        self.reaper = Reaper(self.ctx, self.finisher)
        self.stops = Stops(self.ctx, self._wake.set)
        self.recovery = Recovery(self.ctx, self.reaper)
        self.sweeps = Sweeps(self.session_factory, self.intake, self._queue_changed)
        self.sweep_driver = SweepDriver(self.ctx, self.intake)
        self.cleanup = Cleanup(self.settings, self.session_factory,
                               before_delete=self.sweeps.settle)
        self._snapshot = SnapshotReader(self.ctx.read_sessions, clock=self.clock)
        # The webhook outbox is sent from threads of its own, only while this process acts.
        self.webhooks = Dispatcher(self.settings, loop_sessions, self.ctx.read_sessions,
                                   self.lease)
        # Every job's records to MLflow and TensorBoard, from threads of their own likewise.
        self.tracking = Exporter(self.settings, loop_sessions, self.ctx.read_sessions,
                                 self.lease, best_trial=_best_trial)

    @property
    def acting(self) -> bool:
        """True while this process is the supervisor (it holds the lease)."""
        return self._term is not None and self.ctx.lease.held()

    # --- called by routes -------------------------------------------------------------------
    def submit(
        self, spec: JobSpec, idempotency_key: str | None = None, caller: Caller = ADMIN,
    ) -> tuple[Job, bool]:
        """See :meth:`service.domain.intake.submission.Intake.submit`."""
        return self.intake.submit(spec, idempotency_key, caller)

    def grant_package(self, digest: str, caller: Caller) -> bool:
        """``caller``'s team uploaded ``digest``: it may name it from now on; True when new."""
        if caller.team is None:
            return False
        with self.session_factory() as session:
            granted = identitystore.grant_package(session, digest, caller.team)
            session.commit()
        return granted

    def queue_status(self, job_id: int) -> scheduler.Waiting | None:
        """Queue position and why a queued job waits, as of the supervisor's last scheduling
        pass: from memory in the supervisor (once it made a pass in its term), else from the
        snapshot it published (``service.domain.queue.snapshot``; at most about 2 s older)."""
        waiting = self._waiting if self.acting else None
        if waiting is None:
            return self._snapshot.get(job_id)
        return waiting.get(job_id)

    def resources(
        self,
    ) -> tuple[dict[str, list[str]], dict[str, int], dict[int, tuple[str, str | None, str | None]]]:
        """(kind → every resource name of the host, resource → job holding it, holding job →
        its name, owner and team)."""
        with self.ctx.read_sessions() as session:
            held = repo.allocated_resources(session)
            holders = repo.holders(session, sorted(set(held.values())))
        kinds = {kind: self.inventory.resource_names(kind) for kind in (scheduler.GPU, scheduler.CPU)}
        return kinds, held, holders

    def cluster_nodes(self) -> list[NodeRow]:
        """The cluster's nodes (``Executor.nodes``: Slurm's partition); raises ``ExecutorError``."""
        return self.executor.nodes(self.settings.slurm_partition)

    def cancel(self, job_id: int) -> Job | None:
        """Cancel: the database decides (CAS), then the group gets SIGTERM → grace → SIGKILL.

        Cancelling a terminal job is a no-op that returns it unchanged; None if there is no such job.
        """
        with self.session_factory() as session:
            won = repo.transition(session, job_id, JobState.cancelled, reason="cancelled by user")
            session.commit()
            job = repo.get_job(session, job_id)
        if won:
            logger.info("job %s: cancelled", job_id)
            self._queue_changed()  # the loop stops the group (service.domain.loop.stops)
        return job

    def queue_changed(self) -> None:
        """Something the queue depends on changed (a team's quota, budget or share): the next
        pass runs at once (in this process; another process's supervisor within ``REPLAN_S``)."""
        self._queue_changed()

    def pause(self, job_id: int) -> Job | None:
        """See :meth:`service.domain.loop.pauses.Pauses.pause`."""
        return self.pauses.pause(job_id)

    def resume(self, job_id: int) -> Job | None:
        """See :meth:`service.domain.loop.pauses.Pauses.resume`."""
        return self.pauses.resume(job_id)

    # --- the loop ---------------------------------------------------------------------------
    def start(self) -> None:
        """Start standing by; if the lease is free now, recover at once (before serving)."""
        self.executor.watch(self._wake.set)  # reap at once when a job ends, not a poll later
        self.finisher.start()
        self.webhooks.start()
        self.tracking.start()
        if self.ctx.lease.renew():
            try:
                self._begin_term()
            except Exception as exc:  # the loop recovers on its first pass instead
                if not is_busy(exc):
                    raise
                logger.warning("supervisor: recovery deferred, the database is busy: %s", exc)
        self.ctx.lease.start()
        self._thread = threading.Thread(target=self._run, name="torchyard-supervisor", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the loop and give the lease up. Running groups are left alone (whoever
        supervises next re-adopts them)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.scheduling.close()
        self.finisher.stop()
        self.webhooks.stop()
        self.tracking.stop()
        self.ctx.lease.stop(release=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if self._lead():
                    self.tick()
            except Exception:
                logger.exception("supervisor tick failed")
            poll_s = self.settings.poll_interval_s
            self._wake.wait(max(poll_s, IDLE_POLL_S) if self._was_idle else poll_s)
            self._wake.clear()

    def _lead(self) -> bool:
        """True if this process supervises now; recovers first at the start of a term."""
        lease = self.ctx.lease
        if not lease.held():
            if self._term is not None:
                self._end_term()
            return False
        if lease.generation != self._term:
            self._end_term()
            self._begin_term()
        return self._term is not None

    def _begin_term(self) -> None:
        generation = self.ctx.lease.generation
        self.sweep_driver.reset()  # each term rebuilds the sweeps' studies from the database
        if self.recovery.recover():
            self._term = generation
            self._queue_changed()

    def _end_term(self) -> None:
        """Forget what this process watched: the next holder adopts it from the database."""
        if self._term is not None:
            logger.warning("supervisor: standing by (lease generation %s ended)", self._term)
        self._term = None
        self._was_idle = False
        self.ctx.watched.clear()
        self.sweep_driver.reset()
        self._waiting = self._published = None

    def tick(self) -> None:
        # Each step on its own: one that fails (a bug, a database error) must not starve the
        # others, or a stuck reap would hold every queued job.
        steps = (self.stops.fail_stop_requests, self.stops.stop_ended,
                 self.pauses.tell_pausing, self.pauses.resume_preempted,
                 self.reaper.reap_finished, self.reaper.mark_running,
                 self.sweep_driver.step, self._schedule,
                 self._publish_waiting, self._clean_up)
        self._was_idle = self._idle()
        if self._was_idle:
            steps = (self._schedule, self._publish_waiting, self._clean_up)
        for step in steps:
            try:
                step()
            except Exception as exc:
                if not is_busy(exc):
                    logger.exception("supervisor: %s failed", step.__name__)
                else:  # a lock held elsewhere: this step runs again on the next pass
                    logger.warning("supervisor: %s: database busy, retrying: %s",
                                   step.__name__, getattr(exc, "orig", exc))

    def _idle(self) -> bool:
        """Nothing to stop, pause, reap, resume or advance: this process watches no group, the
        queue did not change, and the database has no unfinished job or running sweep. Then a
        tick is one read, not one per step (docs/benchmarks.md, finding 10: an idle server); a job
        submitted through another process is seen by that read on the next tick (an idle
        loop ticks every ``IDLE_POLL_S``, a busy one every ``poll_interval_s``)."""
        watched = self.ctx.watched
        if self._queue_dirty or watched.refs or watched.awaiting_outcome:
            return False
        try:
            with self.ctx.read_sessions() as session:
                return not sweepstore.anything_unfinished(session)
        except Exception as exc:  # a busy database: run every step, each handles it
            if not is_busy(exc):
                logger.exception("supervisor: the idle check failed")
            return False

    def _clean_up(self) -> None:
        """Retention, unused packages, orphaned run directories (``service.domain.files.cleanup``),
        at most every ``TORCHYARD_RETENTION_SWEEP_S``; on this thread, so no launch races it."""
        self.cleanup.sweep()

    def delete(self, job_id: int) -> None:
        """See :meth:`service.domain.files.cleanup.Cleanup.delete`."""
        self.cleanup.delete(job_id)
        self._queue_changed()

    def _queue_changed(self) -> None:
        self._queue_dirty = True
        self._wake.set()
        self.tracking.wake()  # a new job's run is made now, not at the exporter's next poll

    def _schedule(self) -> None:
        """One scheduling pass (``service.domain.loop.scheduling``), when the queue or the free
        resources changed, or every ``REPLAN_S`` so waiting reasons stay fresh."""
        now = time.time()
        if not self._queue_dirty and now - self._last_plan < REPLAN_S:
            return
        self._queue_dirty, self._last_plan = False, now
        self.scheduling.run_pass(now)

    def _set_waiting(self, waiting: dict[int, scheduler.Waiting]) -> None:
        """The result of a scheduling pass (local) or of the executor's queue (the reaper):
        answered from memory here at once, published to the other processes by the tick's
        ``_publish_waiting``."""
        self._waiting = waiting

    def _publish_waiting(self) -> None:
        """Write the last pass's result to the queue snapshot, under the lease's fence, when it
        differs from what this term last wrote, and at most every ``PUBLISH_MIN_S`` (a burst of
        submits changes every pass; each write is the whole queue, ~160 KB at 10,000 jobs). A
        write deferred by that limit happens on a later tick (every ``poll_interval_s``)."""
        waiting = self._waiting
        if waiting is None or waiting is self._published or waiting == self._published:
            return
        now = self.clock()
        if now - self._published_at < PUBLISH_MIN_S:
            return
        with self.ctx.loop_sessions() as session:
            if not self.ctx.lease.fence(session):
                return
            queuerepo.write_snapshot(session, encode(waiting))
            session.commit()
        self._published, self._published_at = waiting, now


def _best_trial(session: Session, sweep: Sweep) -> int | None:
    """The job id of an ended sweep's best trial (``service.domain.sweeps.manage``), or None."""
    best = view(session, sweep).best
    return best.job_id if best is not None else None
