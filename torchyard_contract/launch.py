"""The launch configuration: what the server writes for a job's attempt loop (``launch.json``).

Written by the supervisor (``service.domain``), read by the attempt loop (``service.run``) on the
job's host; no secrets (those travel only in process environments).
"""

import json
import os
import pwd
import stat
from dataclasses import asdict, dataclass
from pathlib import Path

from torchyard_contract import runwrite
from torchyard_contract.attempts import AttemptBudget, world_size
from torchyard_contract.rundir import RunDir
from torchyard_contract.safefile import read_bytes

LAUNCH_FILE_MAX_BYTES = 4 * 2**20  # as the server writes it: far less (argv, rules)


@dataclass(frozen=True)
class RunAs:
    """The Unix user every process of a job runs as, with its primary group and no supplementary
    groups (docs/security.md, "Run as the team's Unix user"). Chosen by the server
    (``service.domain.identity.runas``) only when it runs as root; the executor starts the job's
    attempt loop with these credentials and the attempt loop refuses to run under any other."""

    user: str
    uid: int
    gid: int

    def login_env(self) -> dict[str, str]:
        """``HOME``, ``USER`` and ``LOGNAME`` of the user (the server's own would point its
        caches at a home it cannot write), from this host's user database."""
        try:
            home = pwd.getpwuid(self.uid).pw_dir
        except KeyError:
            home = "/"
        return {"HOME": home, "USER": self.user, "LOGNAME": self.user}

    def cannot_enter(self, path: Path) -> str | None:
        """Why this user could not reach ``path`` (a directory it must enter: the runs
        directory, the interpreter's, torchyard's checkout), or None: every directory from ``/``
        to ``path`` must be searchable by it (as its owner, its primary group, or others)."""
        current = Path("/")
        for part in (*Path(path).parts[1:], None):
            try:
                st = os.stat(current)
            except OSError as exc:
                return f"{current}: {exc.strerror}"
            if st.st_uid == self.uid:
                ok = st.st_mode & stat.S_IXUSR
            elif st.st_gid == self.gid:
                ok = st.st_mode & stat.S_IXGRP
            else:
                ok = st.st_mode & stat.S_IXOTH
            if not ok:
                return (f"user {self.user} cannot enter {current} (mode {stat.S_IMODE(st.st_mode):04o},"
                        f" owner uid {st.st_uid}): make the directories above it searchable "
                        "(chmod o+x; 0711 keeps them unlisted)")
            if part is None:
                return None
            current = current / part
        return None


@dataclass(frozen=True)
class LaunchConfig:
    """What the server tells a job's attempt loop (``launch.json``; no secrets)."""

    job_id: int
    python: str
    nproc_per_node: int
    max_restarts: int
    max_runtime_s: float | None
    heartbeat_timeout_s: float | None
    stop_grace_s: float
    # What each rank runs after torchrun's options (``service.domain.intake.scriptpath.RankProgram``);
    # None = the built-in trainer (also what a launch.json from before script jobs means).
    program: list[str] | None = None
    pythonpath: str | None = None  # ``-m`` script jobs: the script directory holding the module
    nnodes: int = 1  # > 1 only under the slurm launcher
    gpus_per_node: int = 0  # slurm launcher: GPUs each node's step asks for (0 = CPUs)
    # Package jobs: the job's copy of its package, the ranks' working directory and first on
    # their PYTHONPATH; None = the run directory (and nothing added to the path).
    workdir: str | None = None
    # Retries decided by the cause (``torchyard_contract.retryrules``): the spec's ``on_failure``
    # rules as plain dicts, and the pause before the next attempt (doubling per restart).
    on_failure: list[dict] | None = None
    restart_backoff_s: float = 0.0
    # Hang diagnosis (``service.run.stackdump``): the program that dumps a rank's stacks; None = off.
    stack_sampler: str | None = None
    # A pause (``RunDir.pause_request``): SIGTERM to the ranks, then this long before the group
    # is stopped as a cancel would stop it (docs/lifecycle.md).
    pause_grace_s: float = 60.0
    # The job's Unix user (its team's; None = the server's own user): the attempt loop checks it
    # runs as this uid and gid before it claims the launch.
    run_as: RunAs | None = None

    @property
    def world_size(self) -> int:
        return world_size(self.nnodes, self.nproc_per_node)

    def budget(self, paused_attempts: int = 0) -> AttemptBudget:
        """The job's restart budget, ``paused_attempts``: the attempts a pause ended, as the
        run directory holds them."""
        return AttemptBudget(self.max_restarts, paused_attempts)

    @classmethod
    def read(cls, run: RunDir) -> "LaunchConfig":
        """``launch.json``, read as every file a job can write is (``safefile``: a regular file
        under ``LAUNCH_FILE_MAX_BYTES``, never through a link the job planted). Raises
        ``ValueError`` (or ``TypeError``: fields that are not this model's) otherwise."""
        raw = read_bytes(run.launch_file, LAUNCH_FILE_MAX_BYTES)
        if raw is None:
            raise ValueError(f"{run.launch_file}: missing, not a regular file, or too large")
        data = json.loads(raw)
        if isinstance(data.get("run_as"), dict):
            data["run_as"] = RunAs(**data["run_as"])
        return cls(**data)

    def rank_program(self, run: RunDir) -> tuple[str, ...]:
        if self.program is None:
            # Old launch.json only (the supervisor always writes ``program``): the built-in
            # trainer, as ``service.domain.intake.scriptpath.builtin_program`` spells it.
            return ("-m", "worker", "--spec", str(run.spec_file))
        return tuple(self.program)

    def cwd(self, run: RunDir) -> str:
        """Where torchrun (and so every rank) starts."""
        return self.workdir or str(run.root)

    def rank_env(self, inherited: str | None) -> dict[str, str]:
        """Extra variables of torchrun and the ranks (``inherited``: the attempt loop's PYTHONPATH)."""
        if self.workdir is not None:  # the job's own copy: the working directory is meant
            return {"PYTHONPATH": os.pathsep.join(p for p in (self.workdir, inherited) if p)}
        if self.pythonpath is None:
            return {}
        path = os.pathsep.join(p for p in (self.pythonpath, inherited) if p)
        return {"PYTHONPATH": path, "PYTHONSAFEPATH": "1"}

    def write(self, run: RunDir) -> None:
        """Atomic, and confined to the run directory (``torchyard_contract.runwrite``): a run
        directory that belongs to the job's user may hold anything that user planted."""
        runwrite.make_dir(run.launch_file.parent)
        runwrite.write_file(run.launch_file, json.dumps(asdict(self)).encode())
