"""Where an attempt loop starts its ranks: one object per launcher, chosen once at start
(``python -m service.run.attemptloop --launcher=local|slurm``). Everything that differs between
the two is a method here; the attempt loop never compares a launcher's name.

* :class:`LocalLauncher` (``local``, the local executor's): each attempt's torchrun on this host,
  in the attempt loop's process group, so its ranks are below the attempt loop (warm ranks:
  processes of the warm server, which names them). A pause reaches them as SIGTERM; their stacks
  are dumped here; retry_elsewhere retries in place (one host); the process exits 0 (the
  executor reads the outcome file).
* :class:`SlurmLauncher` (``slurm``, inside a Slurm allocation, on its batch host): each attempt
  is one job step, ``srun`` starting one torchrun per node with a static rendezvous here
  (``service.run.srun``). The ranks are on other hosts: a pause reaches them through the request
  file (``worker.should_stop()``), their stacks through a step overlapping the attempt's;
  retry_elsewhere ends the allocation (outcome ``requeue``) to restart without the failing
  rank's node; the process exits with the last attempt's exit code (the batch script ``exec``s
  the attempt loop, so Slurm's record of the job carries it).
"""

import os
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import psutil

from service.run import fastexit, stackdump
from service.run.proctree import ProcessGroupHandle
from service.run.rankprocs import rank_processes
from service.run.socketport import free_port
from service.run.srun import StepRequest, build_srun_command
from service.run.torchrun import LaunchRequest, build_command
from service.run.warm import RELAY_PATH
from torchyard_contract import envnames as names
from torchyard_contract.childenv import environ_for_children
from torchyard_contract.launch import LaunchConfig
from torchyard_contract.rundir import RunDir
from torchyard_contract.safefile import read_bytes
from torchyard_contract.treeremoval import remove_tree

LAUNCHERS = ("local", "slurm")
SRUN_EXTRA_S = 10.0  # Slurm: starting the stacks step on every node, on top of the dumps


class Launcher(Protocol):
    """What differs between the places an attempt loop runs its ranks (module docstring)."""

    name: str
    # retry_elsewhere can leave the failing rank's node out: the attempt loop ends the launch
    # with the outcome ``requeue`` and the server submits the job again without that node.
    excludes_nodes: bool

    def rank_program(self, run: RunDir, config: LaunchConfig) -> tuple[str, ...]:
        """What torchrun runs in each rank's place, before the rank tee wraps it."""
        ...

    def attempt_env(self) -> dict[str, str]:
        """Variables this launcher adds to an attempt's environment."""
        ...

    def start(
        self, run: RunDir, config: LaunchConfig, logs: Path, program: Sequence[str],
        env: dict[str, str],
    ) -> ProcessGroupHandle:
        """Start one attempt's group; ``logs``: the attempt's log directory."""
        ...

    def torchrun_logs(self, logs: Path) -> list[Path]:
        """torchrun's own output of an attempt, the file that names a failure first."""
        ...

    def tell_pause(self, run: RunDir, config: LaunchConfig) -> int | None:
        """Tell the running ranks the job is pausing: how many were signalled, or None where
        they learn it from the request file themselves."""
        ...

    def dump_stacks(self, run: RunDir, config: LaunchConfig) -> tuple[list[dict], str | None]:
        """Every rank's stack entries now, and an error when none could be taken."""
        ...

    def claim_fields(self) -> dict[str, str]:
        """What the run's claim records besides the process (how an executor adopts it)."""
        ...

    def exit_status(self, exit_code: int | None) -> int:
        """The attempt loop's own exit status once the outcome is written."""
        ...


def exit_status(code: int | None) -> int:
    """A process exit status for an attempt's exit code (a signal -N becomes 128+N)."""
    if code is None:
        return 1
    return 128 - code if code < 0 else min(code, 255)


class LocalLauncher:
    """torchrun on this host. ``warm_socket``: the warm server that serves this job's ranks
    (``service.run.warm``); None = cold, and ``why_cold`` says why when warm ranks are on."""

    name = "local"
    excludes_nodes = False

    def __init__(self, warm_socket: str | None = None, why_cold: str | None = None) -> None:
        self.warm_socket = warm_socket
        self.why_cold = why_cold

    def rank_program(self, run: RunDir, config: LaunchConfig) -> tuple[str, ...]:
        # Warm: the rank tee (stdlib only, quick to start cold) runs the relay, whose warm
        # process becomes the rank program itself. Cold: a ``-m`` program ends without tearing
        # torch down (service.run.fastexit).
        program = config.rank_program(run)
        if self.warm_socket:
            return (str(RELAY_PATH), self.warm_socket, *program)
        return fastexit.wrap(program)

    def attempt_env(self) -> dict[str, str]:
        # A warm rank is not below the attempt loop: it lets this pid trace it (its stacks).
        return {names.STACKS_TRACER: str(os.getpid())} if self.warm_socket else {}

    def start(
        self, run: RunDir, config: LaunchConfig, logs: Path, program: Sequence[str],
        env: dict[str, str],
    ) -> ProcessGroupHandle:
        req = LaunchRequest(
            job_id=config.job_id, python=config.python, nproc_per_node=config.nproc_per_node,
            master_port=free_port(), run_dir=run.root, logs_dir=logs, program=tuple(program),
            env=env, relay=(str(RELAY_PATH), self.warm_socket) if self.warm_socket else None,
            cwd=Path(config.cwd(run)),
        )
        with open(logs / "torchrun.log", "ab") as log:
            if self.why_cold:
                log.write(f"torchyard: warm start unavailable ({self.why_cold}); "
                          "starting cold\n".encode())
                log.flush()
            popen = subprocess.Popen(  # in the attempt loop's group: its stops reach torchrun
                build_command(req), cwd=req.cwd, env={**environ_for_children(os.environ), **env},
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            )
        return ProcessGroupHandle(pid=popen.pid, popen=popen)

    def torchrun_logs(self, logs: Path) -> list[Path]:
        return [logs / "torchrun.log"]

    def tell_pause(self, run: RunDir, config: LaunchConfig) -> int | None:
        told = 0
        for proc in rank_processes(run, config, self.warm_socket).values():
            try:
                proc.send_signal(signal.SIGTERM)
                told += 1
            except psutil.Error:
                continue
        return told

    def dump_stacks(self, run: RunDir, config: LaunchConfig) -> tuple[list[dict], str | None]:
        path, error = stackdump.find_sampler(config.stack_sampler)
        if path is None:
            return [], error
        return stackdump.dump_processes(rank_processes(run, config, self.warm_socket), path,
                                        time.time() + stackdump.DUMP_TIMEOUT_S)

    def claim_fields(self) -> dict[str, str]:
        return {}

    def exit_status(self, exit_code: int | None) -> int:
        return 0


class SlurmLauncher:
    """One job step per attempt inside this Slurm allocation (``SLURM_JOB_ID``)."""

    name = "slurm"
    excludes_nodes = True

    def rank_program(self, run: RunDir, config: LaunchConfig) -> tuple[str, ...]:
        return fastexit.wrap(config.rank_program(run))  # no warm ranks on the nodes

    def attempt_env(self) -> dict[str, str]:
        return {}

    def start(
        self, run: RunDir, config: LaunchConfig, logs: Path, program: Sequence[str],
        env: dict[str, str],
    ) -> ProcessGroupHandle:
        step = StepRequest(
            python=config.python, nnodes=config.nnodes, nproc_per_node=config.nproc_per_node,
            # Rank 0's store listens here, the batch host, on a port free here now.
            master_addr=socket.gethostname(), master_port=free_port(""), logs_dir=logs,
            program=program, gpus_per_node=config.gpus_per_node,
        )
        with open(logs / "srun.log", "ab") as log:
            popen = subprocess.Popen(
                build_srun_command(step), cwd=config.cwd(run), env={**os.environ, **env},
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            )
        return ProcessGroupHandle(pid=popen.pid, popen=popen)

    def torchrun_logs(self, logs: Path) -> list[Path]:
        """One torchrun per node (``node-<k>.log``), then srun's own."""
        nodes = sorted(logs.glob("node-*.log"), key=lambda p: p.name)
        return [*nodes, logs / "srun.log"]

    def tell_pause(self, run: RunDir, config: LaunchConfig) -> int | None:
        return None  # on other hosts: they read the request file (worker.should_stop)

    def dump_stacks(self, run: RunDir, config: LaunchConfig) -> tuple[list[dict], str | None]:
        """``python -m service.run.stackdump`` on every node of the allocation, as a step that
        overlaps the running attempt's; each prints its node's entries as one JSON line."""
        job = os.environ.get("SLURM_JOB_ID")
        if not job:
            return [], "not inside a Slurm allocation (SLURM_JOB_ID unset)"
        # Each node's answer in a file of its own: long lines of two tasks interleave on a pipe.
        try:
            run.stacks_dir.mkdir(parents=True, exist_ok=True)
            out_dir = Path(tempfile.mkdtemp(prefix="nodes-", dir=run.stacks_dir))
        except OSError as exc:
            return [], f"no room for the nodes' answers: {exc}"[:500]
        argv = [
            "srun", f"--jobid={job}", "--overlap", f"--nodes={config.nnodes}",
            f"--ntasks={config.nnodes}", "--ntasks-per-node=1", "--cpus-per-task=1", "--mem=0",
            "--kill-on-bad-exit=0", "--export=ALL", f"--output={out_dir}/node-%n.json",
            config.python, "-m", "service.run.stackdump", str(run.root), str(config.world_size),
            config.stack_sampler or "",
        ]
        try:
            done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True,
                                  timeout=stackdump.DUMP_TIMEOUT_S + SRUN_EXTRA_S, check=False)
            answers = [(read_bytes(p, stackdump.SNAPSHOT_MAX_BYTES) or b"").decode(
                "utf-8", "replace") for p in sorted(out_dir.glob("node-*.json"))]
        except (OSError, subprocess.TimeoutExpired) as exc:
            return [], f"srun could not run the sampler on the nodes: {exc}"[:500]
        finally:
            try:
                remove_tree(out_dir)  # in the run directory, which the job can write: any depth
            except OSError:
                pass  # left for the job's deletion
        entries, errors = stackdump.node_entries(answers)
        if not entries:
            why = errors[0] if errors else " ".join(done.stderr.decode("utf-8", "replace").split())
            return [], (why or f"srun exited with {done.returncode}")[:500]
        return entries, None

    def claim_fields(self) -> dict[str, str]:
        job = os.environ.get("SLURM_JOB_ID")
        return {"slurm_job_id": job} if job else {}  # how the Slurm executor adopts it

    def exit_status(self, exit_code: int | None) -> int:
        return exit_status(exit_code)


def launcher_for(
    name: str, warm_socket: str | None = None, why_cold: str | None = None,
) -> Launcher:
    """The launcher ``--launcher`` names (one of ``LAUNCHERS``); warm ranks are local only."""
    if name == "slurm":
        return SlurmLauncher()
    if name == "local":
        return LocalLauncher(warm_socket, why_cold)
    raise ValueError(f"unknown launcher {name!r}: one of {', '.join(LAUNCHERS)}")
