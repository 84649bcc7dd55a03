"""Launching a job's worker group: a pure command builder and a step that runs it.

``build_command`` is pure (printable as a dry run, unit-testable); ``LocalTorchrunLauncher.start``
runs it in a new session so the whole group can be signalled at once.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import psutil

from service.settings import environ_for_children
from torchyard_contract.rundir import RunDir


@dataclass(frozen=True)
class LaunchRequest:
    """Everything needed to start one attempt; built by the supervisor."""

    job_id: int
    python: str
    nproc_per_node: int
    master_port: int
    run_dir: Path
    logs_dir: Path
    program: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)


def build_command(req: LaunchRequest) -> list[str]:
    """The torchrun argv for a single-node group with static rendezvous on a free port.

    ``req.program`` is what each rank runs, after torchrun's options: ``("-m", "worker",
    "--spec", SPEC)`` for the built-in trainer, ``(SCRIPT, *args)`` or ``("-m", MODULE, *args)``
    for a script job (see ``service.scriptpath``). An argv list, never a shell string.
    """
    return [
        req.python,
        "-m",
        "torch.distributed.run",
        "--nnodes=1",
        f"--nproc-per-node={req.nproc_per_node}",
        "--master-addr=127.0.0.1",
        f"--master-port={req.master_port}",
        "--max-restarts=0",
        f"--log-dir={req.logs_dir}",
        "--redirects=3",
        "--tee=3",
        "--monitor-interval=0.1",  # torchrun's default: notices a rank exit as plain torchrun does
        *req.program,
    ]


# poll() of a group adopted after a server restart: it is not our child, so its code is lost.
UNKNOWN_EXIT = -1000


class GroupHandle(Protocol):
    pid: int

    def poll(self) -> int | None: ...

    def terminate(self, grace_s: float) -> None: ...


@dataclass
class ProcessGroupHandle:
    """A launched group whose leader is ``pid``; also usable for a group adopted by pid."""

    pid: int
    popen: subprocess.Popen[bytes] | None = None

    def poll(self) -> int | None:
        """The leader's exit code (negative: killed by that signal), None while it runs."""
        if self.popen is not None:
            return self.popen.poll()
        return None if _alive(self.pid) else UNKNOWN_EXIT

    def terminate(self, grace_s: float) -> None:
        """SIGTERM the group and every descendant, wait up to ``grace_s``, then SIGKILL what is left.

        torchrun starts each rank in a session of its own, so signalling the leader's process
        group alone would orphan the ranks; the descendants are collected first. Safe to call twice.
        """
        procs = _tree(self.pid)
        _signal_group(self.pid, signal.SIGTERM)
        for proc in procs:
            _signal_proc(proc, signal.SIGTERM)
        _, alive = psutil.wait_procs(procs, timeout=grace_s)
        # Ranks may have been spawned after the snapshot; look once more before the hard stop.
        alive = list({p.pid: p for p in alive + _tree(self.pid)}.values())
        _signal_group(self.pid, signal.SIGKILL)
        for proc in alive:
            _signal_proc(proc, signal.SIGKILL)
        psutil.wait_procs(alive, timeout=5)
        self._reap()

    def _reap(self) -> None:
        if self.popen is not None:
            try:
                self.popen.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass


def _signal_group(pgid: int, sig: signal.Signals) -> bool:
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False  # already gone
    except PermissionError:
        return False


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _tree(pid: int) -> list[psutil.Process]:
    """The leader and all its descendants that are alive now."""
    try:
        leader = psutil.Process(pid)
        return [leader, *leader.children(recursive=True)]
    except psutil.Error:
        return []


def _signal_proc(proc: psutil.Process, sig: signal.Signals) -> None:
    try:
        proc.send_signal(sig)
    except psutil.Error:
        pass  # already gone


def tree_pids(pid: int) -> list[int]:
    return [p.pid for p in _tree(pid)]


class Launcher(Protocol):
    def start_shim(self, run: RunDir, env: dict[str, str]) -> GroupHandle: ...


def build_shim_command(python: str, run: RunDir) -> list[str]:
    return [python, "-m", "service.shim", str(run.root)]


class LocalTorchrunLauncher:
    """Runs torchrun on this host, output to a log file.

    The supervisor starts the job's shim (``start_shim``) in a session of its own; the shim
    then runs each attempt's torchrun in its group (``start``).
    """

    def start_shim(self, run: RunDir, env: dict[str, str]) -> ProcessGroupHandle:
        with open(run.root / "shim.log", "ab") as log:
            popen = subprocess.Popen(
                build_shim_command(sys.executable, run),
                cwd=run.root,
                env={**environ_for_children(os.environ), **env},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return ProcessGroupHandle(pid=popen.pid, popen=popen)

    def start(self, req: LaunchRequest, *, new_session: bool = True) -> ProcessGroupHandle:
        """Start torchrun; ``new_session=False`` keeps it in the caller's group (the shim's)."""
        env = {**environ_for_children(os.environ), **req.env}
        with open(req.logs_dir / "torchrun.log", "ab") as log:
            popen = subprocess.Popen(
                build_command(req),
                cwd=req.run_dir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=new_session,
            )
        return ProcessGroupHandle(pid=popen.pid, popen=popen)
