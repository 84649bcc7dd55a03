"""The supervisor owns jobs' lives and every state change after submission.

One background thread runs ``tick()``: fail jobs a loss guard asked to stop (``service.domain.lossguard``),
stop the groups of cancelled and failed jobs, reap finished ones (their resources are freed at
once; ``service.domain.finisher`` re-ingests their spools and makes them terminal on a thread of its
own), mark started ones running, then run a scheduling pass (``service.domain.queue.scheduler``: priority,
FIFO, gang allocation, backfill behind a reservation). Each step, and each job within a step, is
isolated: whatever one job left in its run directory cannot stop the loop. It is the only code
that allocates resources, so two jobs never share one. Routes call ``submit``, ``cancel``,
``queue_status`` and ``resources``.

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
import sys
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import UTC
from functools import partial

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from service.domain import secretstore
from service.domain.admission import admit
from service.domain.finisher import Finisher
from service.domain.jobtoken import new_token
from service.domain.lease import Lease
from service.domain.queue import scheduler
from service.domain.queue.inventory import Inventory
from service.domain.queue.snapshot import PUBLISH_MIN_S, SnapshotReader, encode
from service.domain.recordscope import world_size
from service.domain.scriptpath import ScriptRefused, ScriptsDisabled, rank_program, script_program
from service.domain.secretstore import SecretRefused
from service.domain.submits import Submits
from service.executor.base import Executor, ExecutorError, NodeRow, Phase, Status, Submission
from service.settings import Settings
from service.store import queue as queuerepo
from service.store import repository as repo
from service.store.db import is_busy
from service.store.tables import Job
from torchyard_contract import claim as runclaim
from torchyard_contract import envnames as names
from torchyard_contract.launch import LaunchConfig
from torchyard_contract.rundir import RunDir
from torchyard_contract.runfiles import read_attempts
from torchyard_contract.spec import SLURM_FIELDS, Backend, Device, JobSpec
from torchyard_contract.state import TERMINAL_STATES, JobState

logger = logging.getLogger(__name__)

# A scheduling pass runs when the queue or free resources change, and at least this often.
REPLAN_S = 2.0
# Slurm: how long a job Slurm calls finished may wait for its outcome file to show up on the
# shared filesystem (NFS caches directory entries) before it ends as "no outcome".
OUTCOME_WAIT_S = 30.0
NEVER_STARTED = "the server stopped while launching the job; it never started"
# Longest the loop's own writes wait for a database lock (a request may hold it, or a paused
# process): then the step fails and runs again on the next pass, so the loop never stalls.
LOOP_LOCK_TIMEOUT_S = 1.0


@dataclass(frozen=True)
class Placement:
    """Where a job runs: the resources it holds and the device/backend that follows."""

    resources: list[str]
    device: str
    backend: str
    gpu_indices: list[int]


def resource_kind(device: str, inventory: Inventory) -> str:
    """``cuda`` → GPUs; ``auto`` → GPUs when the host has them; else CPU slots."""
    wants_gpu = device == Device.cuda.value or (device == Device.auto.value and bool(inventory.gpus))
    return scheduler.GPU if wants_gpu else scheduler.CPU


def placement_for(spec: JobSpec, resources: list[str]) -> Placement:
    """The device and backend that follow from the resources a job was given."""
    if resources and resources[0].startswith("gpu:"):
        backend = "gloo" if spec.backend is Backend.gloo else "nccl"
        return Placement(resources, "cuda", backend, [int(r.split(":")[1]) for r in resources])
    return Placement(resources, "cpu", "gloo", [])


class SubmitRejected(Exception):
    """A spec that is valid on its own but cannot be accepted here (``kind`` says why)."""

    def __init__(self, kind: str, message: str, status: int = 422) -> None:
        super().__init__(message)
        self.kind, self.status = kind, status


def check_capacity(spec: JobSpec, inventory: Inventory) -> None:
    wants_gpu = resource_kind(spec.device.value, inventory) == scheduler.GPU
    have = len(inventory.gpus) if wants_gpu else inventory.cpu_slots
    unit = "GPUs" if wants_gpu else "CPU slots"
    if spec.nproc_per_node > have:
        raise SubmitRejected(
            "unschedulable", f"nproc_per_node: needs {spec.nproc_per_node} {unit}; this host has {have}"
        )


def check_local(spec: JobSpec) -> None:
    """Refuse what only the Slurm executor can run (422, naming the field and why)."""
    if spec.nnodes > 1:
        raise SubmitRejected(
            "unschedulable",
            f"nnodes: {spec.nnodes} nodes need the slurm executor (TORCHYARD_EXECUTOR=slurm); "
            "this server's local executor runs each job on this one host (nnodes 1)",
        )
    for name in SLURM_FIELDS:
        if getattr(spec, name) is not None:
            raise SubmitRejected(
                "invalid_request",
                f"{name}: only the slurm executor reads it; this server runs jobs locally",
            )


@dataclass
class Supervisor:
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
    # Jobs whose processes the executor runs for us: job id → the executor's opaque reference.
    _refs: dict[int, str] = field(default_factory=dict)
    _stopping: set[int] = field(default_factory=set)
    # Slurm jobs already moved out of ``queued`` (so a tick writes only what changed).
    _seen_started: set[int] = field(default_factory=set)
    # Slurm jobs seen ended whose exit.json is not visible yet: job id → first seen (monotonic).
    _awaiting_outcome: dict[int, float] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)
    _wake: threading.Event = field(default_factory=threading.Event)
    # Last scheduling pass of this term: queued job id → position and reason; None before the
    # term's first pass. Replaced whole, never mutated, so routes can read it from other threads.
    _waiting: dict[int, scheduler.Waiting] | None = None
    # What this term last wrote to the queue snapshot (service.domain.queue.snapshot), and when.
    _published: dict[int, scheduler.Waiting] | None = None
    _published_at: float = -math.inf
    # The snapshot as the other processes see it: what this one answers while not supervising.
    _snapshot: SnapshotReader = field(init=False)
    _queue_dirty: bool = True
    _last_plan: float = 0.0
    _thread: threading.Thread | None = None
    _finisher: Finisher = field(init=False)
    # Slurm: submits in flight on their own threads (``service.domain.submits``).
    _submits: Submits = field(init=False)
    # Who supervises (``service.domain.lease``); built from the settings when not given.
    lease: Lease | None = None
    # The lease generation this process last recovered under; None = not acting.
    _term: int | None = None

    def __post_init__(self) -> None:
        self._loop_sessions = self.loop_session_factory or self.session_factory
        if self.lease is None:
            self.lease = Lease(self._loop_sessions, self.settings.lease_ttl_s)
        # Ended jobs are finished (spools re-ingested, terminal state) off this loop's thread,
        # under the lease: a deposed supervisor's finisher writes nothing.
        self._finisher = Finisher(
            runs_dir=self.settings.runs_dir,
            session_factory=self.session_factory,
            max_records_per_rank=self.settings.spool_ingest_max_records,
            on_finished=self._queue_changed,
            fence=self.lease.fence,
        )
        self._snapshot = SnapshotReader(self.read_session_factory or self.session_factory)
        self._submits = Submits(wake=self._queue_changed)

    @property
    def slurm(self) -> bool:
        """Slurm allocates and queues: no local scheduling pass, no local resources booked."""
        return self.executor.name == "slurm"

    @property
    def acting(self) -> bool:
        """True while this process is the supervisor (it holds the lease)."""
        return self._term is not None and self._lease.held()

    @property
    def _lease(self) -> Lease:
        assert self.lease is not None  # set in __post_init__
        return self.lease

    # --- called by routes -------------------------------------------------------------------
    def submit(self, spec: JobSpec, idempotency_key: str | None = None) -> tuple[Job, bool]:
        """Store a queued job; returns (job, created).

        A repeated ``idempotency_key`` returns the job first stored with it (``created`` False),
        so a retried request never launches twice; the same key with a different spec raises
        ``SubmitRejected("idempotency_conflict")``. Also raises ``SubmitRejected`` for a job that
        can never fit this host or names a job that does not exist.
        """
        spec = admit(spec, self.settings)  # 403 script jobs without tokens; 422 paths outside roots
        if idempotency_key is not None:
            existing = self._job_for_key(idempotency_key, spec)
            if existing is not None:
                return existing, False
        if self.slurm:
            pass  # Slurm allocates: a job too big for the cluster is refused by sbatch
        else:
            check_local(spec)
            check_capacity(spec, self.inventory)
        if spec.is_script:  # refuse what could never launch; resolved again at launch
            try:
                script_program(spec, self.settings.script_dir_list)
            except ScriptsDisabled as exc:
                raise SubmitRejected("scripts_disabled", str(exc), status=403) from exc
            except ScriptRefused as exc:
                raise SubmitRejected("invalid_request", str(exc)) from exc
            try:  # names only; values are read at launch
                secretstore.check_names(spec.secret_env, self.settings.secrets_file)
            except SecretRefused as exc:
                raise SubmitRejected("invalid_request", str(exc)) from exc
        with self.session_factory() as session:
            if spec.resume_from is not None and repo.get_job(session, spec.resume_from) is None:
                raise SubmitRejected("invalid_request", f"resume_from: job {spec.resume_from} not found")
            try:
                job = repo.create_job(session, spec, idempotency_key)
                session.commit()
            except IntegrityError:
                # Another request with the same key won the race between lookup and insert.
                session.rollback()
                existing = self._job_for_key(idempotency_key or "", spec)
                if existing is None:
                    raise
                return existing, False
        self._queue_changed()
        return job, True

    def _job_for_key(self, key: str, spec: JobSpec) -> Job | None:
        with self.session_factory() as session:
            job = repo.job_by_idempotency_key(session, key)
        if job is not None and job.spec != spec.model_dump(mode="json"):
            raise SubmitRejected(
                "idempotency_conflict",
                f"Idempotency-Key: already used for job {job.id} with a different spec",
                status=409,
            )
        return job

    def queue_status(self, job_id: int) -> scheduler.Waiting | None:
        """Queue position and why a queued job waits, as of the supervisor's last scheduling
        pass: from memory in the supervisor (once it made a pass in its term), else from the
        snapshot it published (``service.domain.queue.snapshot``; at most about 2 s older)."""
        waiting = self._waiting if self.acting else None
        if waiting is None:
            return self._snapshot.get(job_id)
        return waiting.get(job_id)

    def resources(self) -> tuple[dict[str, list[str]], dict[str, int]]:
        """(kind → every resource name of the host, resource → job holding it)."""
        with (self.read_session_factory or self.session_factory)() as session:
            held = repo.allocated_resources(session)
        kinds = {kind: self.inventory.resource_names(kind) for kind in (scheduler.GPU, scheduler.CPU)}
        return kinds, held

    def slurm_nodes(self) -> list[NodeRow]:
        """The Slurm partition's nodes (``sinfo``); raises ``ExecutorError``."""
        return self.executor.nodes(self.settings.slurm_partition)  # type: ignore[attr-defined]

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
            self._queue_changed()  # the loop stops the group (see _stop_ended)
        return job

    # --- the loop ---------------------------------------------------------------------------
    def start(self) -> None:
        """Start standing by; if the lease is free now, recover at once (before serving)."""
        self.executor.watch(self._wake.set)  # reap at once when a job ends, not a poll later
        self._finisher.start()
        if self._lease.renew():
            try:
                self._begin_term()
            except Exception as exc:  # the loop recovers on its first pass instead
                if not is_busy(exc):
                    raise
                logger.warning("supervisor: recovery deferred, the database is busy: %s", exc)
        self._lease.start()
        self._thread = threading.Thread(target=self._run, name="torchyard-supervisor", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the loop and give the lease up. Running groups are left alone (whoever
        supervises next re-adopts them)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._submits.close()
        self._finisher.stop()
        self._lease.stop(release=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if self._lead():
                    self.tick()
            except Exception:
                logger.exception("supervisor tick failed")
            self._wake.wait(self.settings.poll_interval_s)
            self._wake.clear()

    def _lead(self) -> bool:
        """True if this process supervises now; recovers first at the start of a term."""
        if not self._lease.held():
            if self._term is not None:
                self._end_term()
            return False
        if self._lease.generation != self._term:
            self._end_term()
            self._begin_term()
        return self._term is not None

    def _begin_term(self) -> None:
        generation = self._lease.generation
        if self.recover():
            self._term = generation
            self._queue_changed()

    def _end_term(self) -> None:
        """Forget what this process watched: the next holder adopts it from the database."""
        if self._term is not None:
            logger.warning("supervisor: standing by (lease generation %s ended)", self._term)
        self._term = None
        self._refs.clear()
        self._stopping.clear()
        self._waiting = self._published = None

    def recover(self) -> bool:
        """Before launching anything: adopt live groups, give dead ones a final state; False
        when this process does not hold the lease (nothing done).

        Jobs holding resources are looked at too, whatever their state: a job cancelled just
        before the server stopped is terminal but its group may still be stopping (it is adopted,
        and the loop stops it) or gone (its resources are freed now). A launched job whose
        reference was never stored (the last server died between starting its shim and storing
        it) is adopted from the shim's claim on its run directory, or its launch is given up
        (``torchyard_contract.claim``)."""
        dead: dict[int, str | None] = {}
        with self._loop_sessions() as session:
            if not self._lease.fence(session):
                return False
            holders = set(repo.allocated_resources(session).values())
            jobs = {job.id: job for job in repo.active_jobs(session)}
            # Queued but already handed to the executor (Slurm: pending in its queue).
            jobs.update({job.id: job for job in repo.queued_with_reference(session)})
            for job_id in holders - set(jobs):
                job = repo.get_job(session, job_id)
                if job is not None:
                    jobs[job_id] = job
            for job in jobs.values():
                ref = job.executor_ref
                if ref and not self.executor.reachable(ref):
                    logger.info("job %s: left alone: it runs where this server cannot adopt it "
                                "(%s %s)", job.id, job.executor, ref)
                    continue
                if not ref:
                    ref = self._reference_from_claim(job.id)
                    if ref is None:
                        dead[job.id] = NEVER_STARTED
                        continue
                    job.executor, job.executor_ref = self.executor.name, ref
                if job.executor == self.executor.name and self.executor.adopt(ref):
                    self._refs[job.id] = ref
                    logger.info("job %s: re-adopted (%s %s)", job.id, job.executor, ref)
                    continue
                dead[job.id] = None
            session.commit()
        for job_id, reason in dead.items():
            try:
                self._finish(job_id, None, reason=reason)
            except Exception:  # the server starts anyway; the next start tries again
                logger.exception("job %s: could not be finished at start-up", job_id)
        return True

    def _reference_from_claim(self, job_id: int) -> str | None:
        """The shim's reference from its claim, or None after giving the launch up."""
        run = RunDir.for_job(self.settings.runs_dir, job_id)
        found = runclaim.claim(run, {runclaim.ABANDONED: f"recovery of job {job_id}"})
        if found is None or runclaim.is_abandoned(found):
            logger.info("job %s: launched but never started; its launch is given up", job_id)
            return None
        return self.executor.reference_from_claim(found)

    def tick(self) -> None:
        # Each step on its own: one that fails (a bug, a database error) must not starve the
        # others, or a stuck reap would hold every queued job.
        for step in (self._fail_stop_requests, self._stop_ended, self._reap_finished,
                     self._mark_running, self._launch_queued, self._publish_waiting):
            try:
                step()
            except Exception as exc:
                if not is_busy(exc):
                    logger.exception("supervisor: %s failed", step.__name__)
                else:  # a lock held elsewhere: this step runs again on the next pass
                    logger.warning("supervisor: %s: database busy, retrying: %s",
                                   step.__name__, getattr(exc, "orig", exc))

    def _reap_finished(self) -> None:
        if not self._refs:
            return
        statuses = self.executor.describe(dict(self._refs))
        if self.slurm:
            self._sync_slurm_queue(statuses)
        for job_id, status in statuses.items():
            if status.phase is not Phase.ended or self._outcome_pending(job_id):
                continue
            self._awaiting_outcome.pop(job_id, None)
            del self._refs[job_id]
            self._stopping.discard(job_id)
            self._seen_started.discard(job_id)
            self._finish(job_id, status.exit_code, status.reason)

    def _outcome_pending(self, job_id: int) -> bool:
        """Slurm only: the job ended but its outcome file is not visible here yet (and the
        wait for it has not run out)."""
        if not self.slurm or RunDir.for_job(self.settings.runs_dir, job_id).exit_file.exists():
            return False
        first = self._awaiting_outcome.setdefault(job_id, time.monotonic())
        return time.monotonic() - first < OUTCOME_WAIT_S

    def _sync_slurm_queue(self, statuses: dict[int, Status]) -> None:
        """Jobs Slurm holds pending stay ``queued`` with Slurm's reason; started ones (or ones
        that ended before a tick saw them run) become ``starting``."""
        waiting: dict[int, scheduler.Waiting] = {}
        pending = sorted(j for j, st in statuses.items() if st.phase is Phase.pending)
        for position, job_id in enumerate(pending, start=1):
            reason = statuses[job_id].reason or "None"
            waiting[job_id] = scheduler.Waiting(position, f"Slurm: {reason}")
        started = [j for j, st in statuses.items()
                   if st.phase is not Phase.pending and j not in self._seen_started]
        if started:
            with self._loop_sessions() as session:
                if not self._lease.fence(session):
                    return
                for job_id in started:
                    repo.transition(session, job_id, JobState.starting, started_at=repo.utcnow())
                session.commit()
            self._seen_started.update(started)
        self._set_waiting(waiting)

    def _finish(
        self, job_id: int, shim_code: int | None, why: str | None = None,
        reason: str | None = None,
    ) -> None:
        """Free the job's resources now; the finisher re-ingests its spools and makes it
        terminal, off this thread (``service.domain.finisher``). ``shim_code``: the attempt loop's exit
        code, None when unknown (it ended unwatched); ``why``: the executor's account of the end
        (Slurm's state), used when there is no outcome file; ``reason``: why it failed if it left
        no outcome, when known better than that."""
        ended = repo.utcnow()  # before the release: a job started on its slots starts after
        try:
            with self._loop_sessions() as session:
                if not self._lease.fence(session):
                    return
                repo.release(session, job_id)
                session.commit()
        except Exception as exc:
            if not is_busy(exc):
                raise
            # The job is no longer watched: the finisher (fenced too) frees them as it ends it.
            logger.warning("job %s: resources not freed yet, the database is busy: %s",
                           job_id, getattr(exc, "orig", exc))
        self._finisher.enqueue(job_id, shim_code, why, reason, ended_at=ended)
        self._queue_changed()

    def _mark_running(self) -> None:
        """Sync attempts from the run dir; starting → running once rank 0 of an attempt is ready.

        Only jobs this process watches: another host's run directories are not here."""
        if not self._refs:
            return
        with self._loop_sessions() as session:
            if not self._lease.fence(session):
                return
            for job in repo.active_jobs(session):
                if job.id not in self._refs:
                    continue
                try:
                    self._sync_attempts(session, job)
                except Exception:  # one job's files must not hold the others' (or the loop)
                    logger.exception("job %s: could not read its attempts", job.id)
            session.commit()

    def _sync_attempts(self, session: Session, job: Job) -> None:
        run = RunDir.for_job(self.settings.runs_dir, job.id)
        spec = job.spec or {}
        max_attempts = int(spec.get("max_restarts", 0) or 0) + 1
        attempts = read_attempts(run, max_attempts, world_size(spec))
        if attempts != (job.attempts or []):
            repo.set_attempts(session, job.id, attempts)
        if job.state != JobState.starting.value or not attempts:
            return
        if run.ready_marker(attempts[-1]["number"], 0).exists():
            # Seen up to a tick late; never after the first metric it made possible.
            now = repo.utcnow()
            running_at = min(now, job.first_metric_at) if job.first_metric_at else now
            repo.transition(session, job.id, JobState.running, running_at=running_at)

    def _queue_changed(self) -> None:
        self._queue_dirty = True
        self._wake.set()

    def _launch_queued(self) -> None:
        """One scheduling pass (see ``service.domain.queue.scheduler``), when the queue or the free resources
        changed, or every ``REPLAN_S`` so waiting reasons stay fresh."""
        now = time.time()
        if not self._queue_dirty and now - self._last_plan < REPLAN_S:
            return
        if self.slurm:
            self._queue_dirty, self._last_plan = False, now
            self._submit_to_slurm()
            return
        self._queue_dirty, self._last_plan = False, now
        # Read without the write lock: only this thread allocates, so what it reads stays true
        # until it launches (the launch itself is compare-and-set, so a job cancelled meanwhile
        # is skipped, and the allocation's unique key would refuse a double booking anyway).
        with (self.read_session_factory or self.session_factory)() as reader:
            queue = [
                scheduler.QueuedJob(
                    id=job_id,
                    priority=priority,
                    kind=resource_kind(device, self.inventory),
                    count=count,
                    max_runtime_s=max_runtime_s,
                )
                for job_id, priority, device, count, max_runtime_s
                in repo.queued_for_scheduling(reader)
            ]
            if not queue:
                self._set_waiting({})
                return
            held = repo.allocated_resources(reader)
            running = self._running_jobs(reader, held)
        # Checked at submit, but a restart with fewer GPUs or slots can leave a job that never
        # fits: it would hold the head of its kind's queue forever, so it fails instead.
        queue = [job for job in queue if not self._fail_if_never_fits(job)]
        free = {
            kind: [r for r in self.inventory.resource_names(kind) if r not in held]
            for kind in (scheduler.GPU, scheduler.CPU)
        }
        decision = scheduler.plan(queue, free, running, now)
        if not decision.launches:
            self._set_waiting(decision.waiting)
            return
        with self._loop_sessions() as session:
            for launch in decision.launches:
                job = repo.get_job(session, launch.job_id)
                if job is None:
                    continue
                spec = JobSpec.model_validate(job.spec)
                self._launch(session, job, spec, placement_for(spec, launch.resources))
        self._set_waiting(decision.waiting)

    def _set_waiting(self, waiting: dict[int, scheduler.Waiting]) -> None:
        """The result of a scheduling pass (local) or of Slurm's queue (``_sync_slurm_queue``):
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
        now = time.monotonic()
        if now - self._published_at < PUBLISH_MIN_S:
            return
        with self._loop_sessions() as session:
            if not self._lease.fence(session):
                return
            queuerepo.write_snapshot(session, encode(waiting))
            session.commit()
        self._published, self._published_at = waiting, now

    def _submit_to_slurm(self) -> None:
        """Hand every queued job not yet submitted to Slurm, highest priority first, each on a
        submit thread (``service.domain.submits``: a slow ``sbatch`` holds neither the loop nor the
        other jobs); the answers of earlier submits are stored first. The job stays ``queued``
        (Slurm's queue is the queue) and gets its token now: the token travels in sbatch's
        export file."""
        for job_id, future in self._submits.finished():
            self._submitted(job_id, future)
        with self._loop_sessions() as session:
            for job in repo.queued_unsubmitted(session):
                if job.id in self._refs or self._submits.busy(job.id):
                    continue
                if self._submits.full:
                    break  # the next finished submit wakes the loop for more
                try:
                    spec = JobSpec.model_validate(job.spec)  # e.g. stored before a rule was added
                except ValueError as exc:
                    repo.transition(session, job.id, JobState.failed,
                                    reason=f"could not submit: {exc}")
                    session.commit()
                    continue
                token, token_hash = new_token()
                job.token_hash = token_hash
                session.commit()
                self._submits.start(job.id, partial(self._start_shim, job.id, token, spec, None))

    def _submitted(self, job_id: int, future: Future[str]) -> None:
        """Store what a submit thread's ``executor.submit`` answered: the reference, or the job
        fails with why (whatever failed, the job must not stay queued)."""
        with self._loop_sessions() as session:
            try:
                ref = future.result()
            except Exception as exc:
                if not isinstance(exc, ScriptRefused | SecretRefused | OSError | ExecutorError
                                  | ValueError):
                    logger.exception("job %s: submit failed", job_id)
                repo.transition(session, job_id, JobState.failed, reason=f"could not submit: {exc}")
                session.commit()
                logger.info("job %s: could not submit: %s", job_id, exc)
                return
            self._refs[job_id] = ref  # a job cancelled meanwhile is stopped by _stop_ended
            job = repo.get_job(session, job_id)
            if job is not None:
                job.executor, job.executor_ref = self.executor.name, ref
            session.commit()
        logger.info("job %s: submitted (%s %s)", job_id, self.executor.name, ref)

    def _fail_if_never_fits(self, job: scheduler.QueuedJob) -> bool:
        have = len(self.inventory.resource_names(job.kind))
        if job.count <= have:
            return False
        unit = "GPUs" if job.kind == scheduler.GPU else "CPU slots"
        with self._loop_sessions() as session:
            if not self._lease.fence(session):
                return True  # not ours to decide now; skipped this pass
            repo.transition(
                session, job.id, JobState.failed,
                reason=f"nproc_per_node: needs {job.count} {unit}; this host has {have}",
            )
            session.commit()
        logger.info("job %s: can never fit this host; failed", job.id)
        return True

    def _running_jobs(
        self, session: Session, held: dict[str, int]
    ) -> list[scheduler.RunningJob]:
        """Jobs holding resources, with the time by which their deadline ends them."""
        by_job: dict[int, list[str]] = {}
        for resource, job_id in held.items():
            by_job.setdefault(job_id, []).append(resource)
        running = []
        for job_id, resources in by_job.items():
            job = repo.get_job(session, job_id)
            limit = (job.spec or {}).get("max_runtime_s") if job is not None else None
            started = job.started_at if job is not None else None
            # The shim stops a job at its deadline with SIGTERM → grace → SIGKILL.
            ends_by = (
                started.replace(tzinfo=UTC).timestamp() + limit + self.settings.stop_grace_s
                if limit is not None and started is not None
                else math.inf
            )
            kind = scheduler.GPU if resources[0].startswith("gpu:") else scheduler.CPU
            running.append(scheduler.RunningJob(job_id, kind, len(resources), ends_by))
        return running

    def _launch(self, session: Session, job: Job, spec: JobSpec, placement: Placement) -> None:
        token, token_hash = new_token()
        if not self._lease.fence(session) or not repo.transition(
            session, job.id, JobState.starting,
            started_at=repo.utcnow(), devices=",".join(placement.resources), token_hash=token_hash,
        ):
            session.rollback()
            return
        repo.allocate(session, job.id, placement.resources)
        session.commit()
        try:
            ref = self._start_shim(job.id, token, spec, placement)
        except Exception as exc:  # whatever failed, the job must not stay starting, holding slots
            if not isinstance(exc, ScriptRefused | SecretRefused | OSError):
                logger.exception("job %s: launch failed", job.id)
            if self._lease.fence(session):  # else the next supervisor gives the launch up
                repo.transition(
                    session, job.id, JobState.failed, reason=f"could not start: {exc}"
                )
                repo.release(session, job.id)
            session.commit()
            self._queue_changed()
            return
        self._refs[job.id] = ref
        if self.settings.test_launch_pause_s:  # tests: a window to kill the server in
            time.sleep(self.settings.test_launch_pause_s)
        if not self._lease.fence(session):
            # The next supervisor adopts the shim from its claim on the run (torchyard_contract.claim).
            session.rollback()
            logger.warning("job %s: lease lost while launching; left to the next supervisor",
                           job.id)
            return
        job_row = repo.get_job(session, job.id)
        if job_row is not None:
            job_row.executor, job_row.executor_ref = self.executor.name, ref
        session.commit()
        logger.info("job %s: launched (%s %s) on %s", job.id, self.executor.name, ref,
                    placement.resources)

    def _start_shim(
        self, job_id: int, token: str, spec: JobSpec, placement: Placement | None
    ) -> str:
        """Write the run directory and submit the job's shim; its reference, or raises."""
        run = RunDir.for_job(self.settings.runs_dir, job_id)
        run.prepare()
        run.spec_file.write_text(spec.model_dump_json(indent=2))
        # The script may have gone away (or out of bounds) since submit: ScriptRefused.
        program = rank_program(spec, self.settings.script_dir_list, run.spec_file)
        LaunchConfig(
            job_id=job_id,
            python=self.settings.python_executable or sys.executable,
            nproc_per_node=spec.nproc_per_node,
            max_restarts=spec.max_restarts,
            max_runtime_s=spec.max_runtime_s,
            heartbeat_timeout_s=spec.heartbeat_timeout_s,
            stop_grace_s=self.settings.stop_grace_s,
            program=list(program.argv),
            pythonpath=program.pythonpath,
            nnodes=spec.nnodes,
        ).write(run)
        env = self._rank_env(job_id, token, run, spec, placement)
        return self.executor.submit(Submission(
            job_id=job_id, run=run, env=env, nproc_per_node=spec.nproc_per_node,
            nnodes=spec.nnodes,
        ))

    def _rank_env(
        self, job_id: int, token: str, run: RunDir, spec: JobSpec, placement: Placement | None
    ) -> dict[str, str]:
        """``placement`` None: Slurm places the job (and sets CUDA_VISIBLE_DEVICES itself); the
        device and backend are set only where the spec names them, else each rank picks."""
        if placement is None:
            return self._slurm_rank_env(job_id, token, run, spec)
        cores = self.inventory.cpu_slots
        # CPU jobs: one thread per slot held; GPU jobs: share the host's cores among the ranks.
        threads = 1 if placement.device == "cpu" else max(1, cores // spec.nproc_per_node)
        env = self._common_env(job_id, token, run, spec)
        env.update({
            names.DEVICE: placement.device,
            names.BACKEND: placement.backend,
            "OMP_NUM_THREADS": str(threads),
            "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in placement.gpu_indices),
        })
        return env

    def _slurm_rank_env(
        self, job_id: int, token: str, run: RunDir, spec: JobSpec
    ) -> dict[str, str]:
        env = self._common_env(job_id, token, run, spec)
        if spec.device is not Device.auto:
            env[names.DEVICE] = spec.device.value
        if spec.backend is not Backend.auto:
            env[names.BACKEND] = spec.backend.value
        elif spec.device is Device.cpu:
            env[names.BACKEND] = Backend.gloo.value
        if spec.device is Device.cpu:
            env["OMP_NUM_THREADS"] = "1"  # one CPU per rank (--cpus-per-task=nproc_per_node)
        return env

    def _common_env(self, job_id: int, token: str, run: RunDir, spec: JobSpec) -> dict[str, str]:
        env = {
            **spec.env,  # a script job's own variables; never torchyard's (JobSpec refuses them)
            # Its secrets: only ever in a process environment (see service.domain.secretstore).
            **secretstore.resolve(spec.secret_env, self.settings.secrets_file),
            names.API_URL: self.api_url,
            names.JOB_ID: str(job_id),
            names.JOB_TOKEN: token,
            names.RUN_DIR: str(run.root),
            names.ERROR_FILE: str(run.error_file),
            "PYTHONUNBUFFERED": "1",
        }
        if spec.resume_from is not None:
            source = RunDir.for_job(self.settings.runs_dir, spec.resume_from)
            env[names.RESUME_DIR] = str(source.checkpoints_dir)
        return env

    def _fail_stop_requests(self) -> None:
        """Jobs a loss guard asked to stop (``service.domain.lossguard``) fail with its reason; the next
        step stops their groups like a cancel."""
        with self._loop_sessions() as session:
            if not self._lease.fence(session):
                return
            requests = repo.stop_requested(session)
            for job_id, reason in requests:
                if repo.transition(session, job_id, JobState.failed, reason=reason):
                    logger.info("job %s: stopped by a loss guard: %s", job_id, reason)
            session.commit()

    def _stop_ended(self) -> None:
        """Jobs whose group still runs but which are terminal in the database (cancelled, or
        failed by a guard) are stopped by the executor, each in its own thread."""
        running = [j for j in self._refs if j not in self._stopping]
        if not running:
            return
        with self._loop_sessions() as session:
            for job_id in running:
                job = repo.get_job(session, job_id)
                if job is not None and JobState(job.state) in TERMINAL_STATES:
                    self._stopping.add(job_id)
                    threading.Thread(
                        target=self._stop_group, args=(job_id,), daemon=True
                    ).start()

    def _stop_group(self, job_id: int) -> None:
        ref = self._refs.get(job_id)
        if ref is not None:
            self.executor.cancel(ref, self.settings.stop_grace_s)  # SIGTERM → grace → SIGKILL
        self._wake.set()  # the reaper records the exit and frees the resources

