"""Every process a job starts ends with its attempt: the shim is a child subreaper.

A job's code can leave processes behind that neither torchrun nor a process-group signal
reaches: a child started with ``start_new_session=True`` (its own session and group) or a
double-forked daemon (its parent gone, so it is nobody's descendant). On Linux the shim marks
itself a *child subreaper* (``prctl(PR_SET_CHILD_SUBREAPER)``, through ctypes): an orphan in its
tree is re-parented to the shim instead of to init, so every process the job started stays a
descendant of the shim, whatever session or group it moved to. At the end of each attempt the
shim stops all of them (SIGTERM, a short grace, SIGKILL) and reaps them.

Elsewhere (no prctl) ``become_subreaper`` returns False and only the descendants still attached
to the tree are stopped. A process that escapes the tree anyway (ptrace tricks, a daemon started
through another service such as systemd-run or at) is beyond what this can see; a cgroup would be.
"""

import ctypes
import ctypes.util
import logging
import os
import signal

import psutil

logger = logging.getLogger(__name__)

PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Make this process the child subreaper of its tree; False where the kernel cannot."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def stop_descendants(grace_s: float) -> list[int]:
    """SIGTERM every descendant of this process, SIGKILL what is left after ``grace_s``, reap
    the zombies. Returns the pids it found. Call it only once the children this process waits
    for itself (torchrun) were reaped: it reaps any child."""
    me = psutil.Process()
    found = _descendants(me)
    for proc in found:
        _signal(proc, signal.SIGTERM)
    _, alive = psutil.wait_procs(found, timeout=grace_s)
    # Another look: a process may have forked while it was being stopped.
    alive = list({p.pid: p for p in alive + _descendants(me)}.values())
    for proc in alive:
        _signal(proc, signal.SIGKILL)
    psutil.wait_procs(alive, timeout=5)
    reap_zombies()
    return [p.pid for p in found]


def reap_zombies() -> None:
    """Collect every exited child (orphans re-parented to a subreaper become its children)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _descendants(proc: psutil.Process) -> list[psutil.Process]:
    try:
        return proc.children(recursive=True)
    except psutil.Error:
        return []


def _signal(proc: psutil.Process, sig: signal.Signals) -> None:
    try:
        proc.send_signal(sig)
    except psutil.Error:
        pass  # already gone
