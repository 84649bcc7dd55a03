"""Process trees on this host, in one place: stop a tree (SIGTERM → grace → SIGKILL), be a
child subreaper, die with the parent, and tell a pid from a later one that reused it.

Used by the local executor (a job's attempt loop), the attempt loop itself (each attempt's torchrun, and what a
job leaves behind), the warm server (its children and what they leave) and ``serve --workers``
(each API process dies with its parent). The child environment (what a job's processes inherit) is
the contract's: ``torchyard_contract.childenv``.

Subreaper: a job's code can leave processes behind that neither torchrun nor a process-group
signal reaches: a child started with ``start_new_session=True`` (its own session and group) or a
double-forked daemon (its parent gone, so it is nobody's descendant). On Linux the attempt loop marks
itself a *child subreaper* (``prctl(PR_SET_CHILD_SUBREAPER)``, through ctypes): an orphan in its
tree is re-parented to the attempt loop instead of to init, so every process the job started stays a
descendant of the attempt loop, whatever session or group it moved to. At the end of each attempt the
attempt loop stops all of them (:func:`stop_descendants`) and reaps them. Elsewhere (no prctl)
:func:`become_subreaper` returns False and only the descendants still attached to the tree are
stopped. A process that escapes the tree anyway (ptrace tricks, a daemon started through another
service such as systemd-run or at) is beyond what this can see; a cgroup would be.
"""

import ctypes
import os
import signal
import subprocess
from collections.abc import Callable
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
        stop_tree(lambda: tree(self.pid), grace_s, group=self.pid)
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


def start_ticks(pid: int) -> int | None:
    """When ``pid`` started, in clock ticks since boot (``/proc/PID/stat``, field 22); None if
    it is gone or there is no ``/proc``. Unlike :func:`create_time` it never moves: psutil adds
    the boot time, which Linux recomputes from the wall clock at every read (``btime``), so an
    NTP correction or a VM's clock step moves every process's create time by whole seconds, and
    two processes reading at different moments disagree (psutil issues 2526 and 2541). Seen
    here: a re-adopted attempt loop judged gone after a restart on a stalled VM, its live job failed."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
        return int(fields[19])  # fields[0] is field 3 (the state)
    except (OSError, IndexError, ValueError):
        return None


def same_process(pid: int, started: float | None, ticks: int | None = None) -> bool:
    """A pid is the one we started only if its start matches too (pids are reused): its
    :func:`start_ticks` where the reference has them, else its create time (references and
    claims written before the ticks were)."""
    if ticks is not None:
        return start_ticks(pid) == ticks and _alive(pid)
    if started is None:
        return False
    now = create_time(pid)
    return now is not None and abs(now - started) < CREATE_TIME_TOLERANCE_S and _alive(pid)


def stop_tree(
    find: Callable[[], list[psutil.Process]], grace_s: float, group: int | None = None
) -> list[psutil.Process]:
    """SIGTERM what ``find()`` returns (and process group ``group``), wait up to ``grace_s``,
    look again (a process may have forked meanwhile), SIGKILL what is left and wait for it.
    Returns what the first look found."""
    found = find()
    if group is not None:
        _signal_group(group, signal.SIGTERM)
    for proc in found:
        _signal_proc(proc, signal.SIGTERM)
    _, alive = psutil.wait_procs(found, timeout=grace_s)
    alive = list({p.pid: p for p in alive + find()}.values())
    if group is not None:
        _signal_group(group, signal.SIGKILL)
    for proc in alive:
        _signal_proc(proc, signal.SIGKILL)
    psutil.wait_procs(alive, timeout=5)
    return found


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and every descendant now, without waiting (a single-threaded server)."""
    for proc in tree(pid):
        _signal_proc(proc, signal.SIGKILL)


def tree(pid: int) -> list[psutil.Process]:
    """The leader and all its descendants that are alive now."""
    try:
        leader = psutil.Process(pid)
        return [leader, *leader.children(recursive=True)]
    except psutil.Error:
        return []


def children(pid: int | None = None) -> list[int]:
    """The pids of the direct children of ``pid`` (this process by default)."""
    try:
        return [p.pid for p in psutil.Process(pid).children()]
    except psutil.Error:
        return []


def exists(pid: int) -> bool:
    return psutil.pid_exists(pid)


def descendants(pid: int | None = None) -> list[psutil.Process]:
    """Every descendant of ``pid`` (this process by default), not the process itself."""
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


# --- this process's place in the tree (Linux prctl, through ctypes) ------------------------
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
PR_SET_PTRACER = 0x59616D61  # Yama: who besides ancestors may ptrace this process


def allow_tracer(pid: int) -> bool:
    """Let ``pid`` and its descendants ptrace this process where Yama's ``ptrace_scope`` is 1
    (ancestors only). False without Yama: then nothing restricts the tracer beyond the uid."""
    return prctl(PR_SET_PTRACER, pid)


def prctl(option: int, value: int) -> bool:
    """``prctl(option, value)``; False where the kernel or libc has none (not Linux)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)  # the C library already loaded: no ldconfig
        return libc.prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def become_subreaper() -> bool:
    """Make this process the child subreaper of its tree; False where the kernel cannot."""
    return prctl(PR_SET_CHILD_SUBREAPER, 1)


def die_with_parent(sig: int, parent: int) -> bool:
    """Get ``sig`` when the parent thread dies (``PR_SET_PDEATHSIG``). False when ``parent``
    (its pid, read before this process was started or forked) is gone already: the signal
    was armed too late to come, so the caller should end now."""
    prctl(PR_SET_PDEATHSIG, sig)
    return os.getppid() == parent


def stop_descendants(grace_s: float) -> list[int]:
    """SIGTERM every descendant of this process, SIGKILL what is left after ``grace_s``, reap
    the zombies. Returns the pids it found. Call it only once the children this process waits
    for itself (torchrun) were reaped: it reaps any child."""
    found = stop_tree(descendants, grace_s)
    reap_zombies()
    return [p.pid for p in found]


def reap_zombies(on_exit: Callable[[int, int], None] | None = None) -> None:
    """Collect every exited child (orphans re-parented to a subreaper become its children);
    ``on_exit(pid, wait status)`` for each."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if on_exit is not None:
            on_exit(pid, status)


def _signal_group(pgid: int, sig: signal.Signals) -> bool:
    try:
        os.killpg(pgid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False  # already gone


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _signal_proc(proc: psutil.Process, sig: signal.Signals) -> None:
    try:
        proc.send_signal(sig)
    except psutil.Error:
        pass  # already gone
