"""Launching a job's worker group: a pure command builder and a step that runs it.

``build_command`` is pure (printable as a dry run, unit-testable); ``LocalTorchrunLauncher.start``
runs it in a new session so the whole group can be signalled at once.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import psutil


@dataclass(frozen=True)
class LaunchRequest:
    """Everything needed to start one attempt; built by the supervisor."""

    job_id: int
    python: str
    nproc_per_node: int
    master_port: int
    run_dir: Path
    spec_file: Path
    logs_dir: Path
    env: dict[str, str] = field(default_factory=dict)


def build_command(req: LaunchRequest) -> list[str]:
    """The torchrun argv for a single-node group with static rendezvous on a free port."""
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
        "--monitor-interval=0.2",
        "-m",
        "worker",
        "--spec",
        str(req.spec_file),
    ]


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
        if self.popen is not None:
            return self.popen.poll()
        return None if psutil.pid_exists(self.pid) else -1

    def terminate(self, grace_s: float) -> None:
        """SIGTERM the group, wait up to ``grace_s``, then SIGKILL it. Safe to call twice."""
        if not _signal_group(self.pid, signal.SIGTERM):
            self._reap()
            return
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            if self.poll() is not None and not _group_alive(self.pid):
                break
            time.sleep(0.05)
        _signal_group(self.pid, signal.SIGKILL)
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


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


class Launcher(Protocol):
    def start(self, req: LaunchRequest) -> GroupHandle: ...


class LocalTorchrunLauncher:
    """Runs torchrun on this host, in its own session (process group), output to a log file."""

    def start(self, req: LaunchRequest) -> ProcessGroupHandle:
        env = {**os.environ, **req.env}
        with open(req.run_dir / "torchrun.log", "ab") as log:
            popen = subprocess.Popen(
                build_command(req),
                cwd=req.run_dir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return ProcessGroupHandle(pid=popen.pid, popen=popen)


def group_alive(pgid: int) -> bool:
    return _group_alive(pgid)
