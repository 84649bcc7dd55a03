"""The executor seam: everything that starts, watches, adopts, cancels and finds the output of a
job's processes goes through :class:`Executor`.

An executor runs a job's *attempt loop* (``python -m service.run.attemptloop RUN_DIR``: restarts,
heartbeats, deadline, ``exit.json``) somewhere — as a local process group, or inside a Slurm
allocation — and names what it started with an opaque *reference* string that the database
stores and only that executor interprets (locally the attempt loop's pid and start time; on Slurm the
job id). Nothing outside an executor knows pids, ``psutil``, ``sbatch`` or node names.

The job's outcome is never the executor's to decide: the attempt loop writes it to
``RUN_DIR/exit.json`` (``torchyard_contract.rundir``). An executor only says whether the loop is
still pending, running or gone.
"""

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Literal, Protocol

from torchyard_contract.launch import RunAs
from torchyard_contract.rundir import RunDir

# "combined": both streams of the rank in one file, in the order written (``RunDir.rank_output``,
# written by ``service.run.ranktee``); an executor that cannot keep that order may interleave them
# and mark each line with its stream. "stderr"/"stdout": one stream.
LogStreamName = Literal["combined", "stderr", "stdout"]


@dataclass(frozen=True)
class Submission:
    """One job to start; its run directory (spec, ``launch.json``) is already written.

    ``env`` is the rank environment (``torchyard_contract.envnames``); it holds the job token, so
    an executor passes it only through a process environment, never an argv or a file.
    """

    job_id: int
    run: RunDir
    env: Mapping[str, str]
    nproc_per_node: int
    nnodes: int = 1
    # Nodes the job must not run on: where its ranks failed before, a ``retry_elsewhere`` rule
    # asking for another node (only an executor with ``excludes_nodes`` gets any).
    exclude_nodes: tuple[str, ...] = ()
    # The Unix user every process of the job runs as, its primary group, no supplementary
    # groups (its team's; None = the server's own user). Only a server running as root is
    # given one; its run directory already belongs to that user.
    run_as: RunAs | None = None
    # The job's team's Slurm account and QOS (``teams.slurm_account``/``slurm_qos``): what an
    # executor that charges accounts uses when the spec names none; the local one ignores them.
    account: str | None = None
    qos: str | None = None


@dataclass(frozen=True)
class DryRun:
    """What ``submit`` would run, printable: ``argv`` in ``cwd`` (on Slurm: ``sbatch`` and the
    batch ``script``). ``env_names``: the variables it would set, values withheld (secrets)."""

    argv: tuple[str, ...]
    cwd: Path
    env_names: tuple[str, ...]
    script: str | None = None


class Phase(str, Enum):
    pending = "pending"  # accepted, not started yet (Slurm: waiting in the queue)
    running = "running"  # the attempt loop is alive
    ended = "ended"  # the attempt loop is gone; RUN_DIR/exit.json says how the job ended


@dataclass(frozen=True)
class Status:
    """What the executor knows of one job. ``exit_code``: the attempt loop's own exit code when
    the executor saw it end (None when it cannot know, e.g. a local job adopted after a server
    restart); ``reason``: why it is pending, in the executor's words (Slurm: "Resources")."""

    phase: Phase
    exit_code: int | None = None
    reason: str | None = None
    # Ended because the executor's own scheduler cancelled it (Slurm: CANCELLED, an operator's
    # scancel), maybe before it ever ran: with no outcome file it ends ``cancelled``, not failed.
    cancelled: bool = False
    # The executor's record says the job was never given a node (Slurm: no BatchHost), so no
    # outcome file will ever appear: the reaper need not wait ``outcome_visible_within_s``.
    never_ran: bool = False


@dataclass(frozen=True)
class RankLog:
    """Where one global rank's output of one attempt is. ``node``: the host it ran on (None on
    the local executor: the server's own); ``path`` is None until the rank has written it."""

    rank: int
    node: str | None
    path: Path | None


class Executor(Protocol):
    """Runs jobs' attempt loops. Methods may be called from several threads."""

    name: str  # stored with each job: "local", "slurm"
    # True: the executor queues and places jobs itself (Slurm): the supervisor hands it every
    # queued job at once, books no resources of this host, and reads the job's place from it.
    # False: the supervisor's scheduler places jobs on this host's inventory.
    queues_jobs: bool
    # Longest an ended job's outcome file (``exit.json``) may take to become visible to the
    # server after the executor reports the end (a shared filesystem caches directory entries).
    outcome_visible_within_s: float
    # True: a job's attempt loop may end a launch to be submitted again without the node a rank
    # failed on (the outcome ``requeue``, ``retry_elsewhere``); the executor honours
    # ``Submission.exclude_nodes`` (Slurm: ``--exclude``). False: retry_elsewhere retries in place,
    # and a launch whose outcome says ``requeue`` anyway fails.
    excludes_nodes: bool
    # True: a job may span several nodes (``nnodes`` > 1) and ``nodes`` lists the cluster's;
    # False: one host, whose own GPUs and CPU slots the supervisor books.
    spans_nodes: bool

    def dry_run(self, sub: Submission) -> DryRun:
        """What ``submit`` would run; pure: starts nothing, touches nothing."""
        ...

    def submit(self, sub: Submission) -> str:
        """Start the job's attempt loop; returns its opaque reference. Raises on failure (then
        nothing of the job is left running)."""
        ...

    def describe(self, references: Mapping[int, str]) -> dict[int, Status]:
        """Status of many jobs (job id → reference) in one call — one ``squeue`` per tick on
        Slurm. Every job asked about is answered; a reference naming nothing alive is ``ended``."""
        ...

    def cancel(self, reference: str, grace_s: float) -> None:
        """Stop the job's whole process tree: SIGTERM, ``grace_s`` to finish, then SIGKILL.
        Blocks until done; idempotent (a job already gone is not an error)."""
        ...

    def adopt(self, reference: str) -> bool:
        """After a server restart: True when the job ``reference`` names is still pending or
        running (it is then watched like one this process submitted), False when it is gone."""
        ...

    def reachable(self, reference: str) -> bool:
        """False when ``reference`` names a job this process cannot adopt or watch from where it
        runs (a local job started on another host): a supervisor then leaves it alone, neither
        adopting it nor failing it. True for executors whose jobs are reachable from anywhere."""
        ...

    def reference_from_claim(self, claim: Mapping[str, object]) -> str | None:
        """The reference of a job whose attempt loop claimed its run directory
        (``torchyard_contract.claim``: ``pid``, ``create_time``, ``start_ticks``, ``host`` as it
        wrote them), for a recovery that finds a launched job whose reference was never stored
        (the server died between ``submit`` and storing it). None when the claim names nothing
        it could adopt."""
        ...

    def rank_log(
        self, run: RunDir, attempt: int, rank: int, stream: LogStreamName
    ) -> RankLog:
        """Where ``rank`` (global) of ``attempt`` wrote ``stream`` (``combined``: both, as
        above)."""
        ...

    def preflight(self, runs_dir: Path, api_url: str) -> None:
        """Before the server starts: raise ``ValueError`` naming what to change when jobs could
        not run (on Slurm: nodes that cannot reach ``api_url`` or see ``runs_dir``)."""
        ...

    def nodes(self, partition: str | None) -> list["NodeRow"]:
        """The cluster's nodes and their state (Slurm: ``sinfo`` of ``partition``) for
        ``GET /resources``; raises ``ExecutorError``. An executor that does not span nodes
        returns ``[]``."""
        ...

    def watch(self, wake: Callable[[], None]) -> None:
        """Call ``wake()`` (from any thread) when a job may have changed phase, so the caller
        need not wait for its next poll. Best effort: the caller polls ``describe`` anyway."""
        ...


class ExecutorError(RuntimeError):
    """The executor's backend could not do or answer what was asked (e.g. a Slurm command
    failed or timed out); callers above the seam catch this, never a backend's own class."""


@dataclass(frozen=True)
class NodeRow:
    """One node of a cluster an executor submits to (Slurm: a row of ``sinfo``)."""

    name: str
    hostname: str
    state: str  # idle, mixed, allocated, down, drained, … (sinfo's long form, lower case)
    cpus_allocated: int
    cpus: int
    gres: str | None  # e.g. "gpu:a100:4(S:0-1)"; None without GRES
    partition: str

    @property
    def gpus(self) -> int:
        """GPUs of the node's GRES (``gpu:4``, ``gpu:a100:4``, several entries summed)."""
        total = 0
        for entry in (self.gres or "").split(","):
            m = re.match(r"gpu(?::[^:(]+)?:(\d+)", entry.strip())
            total += int(m.group(1)) if m else 0
        return total


@dataclass(frozen=True)
class WarmStatus:
    """What ``GET /resources`` and Prometheus report. ``state``: ``starting`` (importing torch),
    ``ready`` (serving), ``broken`` (cannot serve: the socket's directory is unsafe; ``reason``
    says why)."""

    state: str
    pool_size: int
    idle: int = 0
    active: int = 0
    served: int = 0
    refused: int = 0
    memory_bytes: int = 0
    memory_limit_bytes: int = 0
    pid: int | None = None
    cuda_initialized: bool = False
    restarts: int = 0
    reason: str = ""  # why jobs start cold now ("" while ready); not in /resources


class WarmReporter(Protocol):
    """The warm-rank pool as the HTTP side sees it (``GET /resources``, Prometheus): its status,
    nothing that starts or stops a process."""

    def status(self) -> WarmStatus: ...
