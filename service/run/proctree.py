"""Process groups on this host: signal a whole tree, SIGTERM → grace → SIGKILL.

Used by the local executor (a job's shim) and by the shim itself (each attempt's torchrun).
"""

import os
import signal
import subprocess
from dataclasses import dataclass

import psutil

# Create times are compared with this tolerance (psutil reports them rounded to clock ticks).
CREATE_TIME_TOLERANCE_S = 0.01


@dataclass
class ProcessGroupHandle:
    """A launched group whose leader is ``pid``; ``popen`` is None for a group adopted by pid."""

    pid: int
    popen: subprocess.Popen[bytes] | None = None

    def poll(self) -> int | None:
        """The leader's exit code (negative: killed by that signal), None while it runs.

        An adopted leader is not our child, so its code is lost: it reads as None while alive and
        ``UNKNOWN_EXIT`` once gone."""
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


# poll() of a group adopted after a server restart: it is not our child, so its code is lost.
UNKNOWN_EXIT = -1000


def create_time(pid: int) -> float | None:
    """When ``pid`` started (seconds since the epoch), None if it is gone."""
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def same_process(pid: int, started: float | None) -> bool:
    """A pid is the one we started only if its start time matches too (pids are reused)."""
    if started is None:
        return False
    now = create_time(pid)
    return now is not None and abs(now - started) < CREATE_TIME_TOLERANCE_S and _alive(pid)


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
