"""service.run.proctree, the one process-tree module: stop a tree (a child in a session of its
own included), be a subreaper that stops a double-forked daemon, die with the parent, prctl
without starting ldconfig, and an adopted process's exit told through a pidfd. Real processes."""

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import psutil

from service.executor.local import LocalExecutor
from service.executor.reference import encode_reference
from service.run import proctree
from tests.conftest import REPO_ROOT, gone


def _python(code: str, tmp_path: Path, **kw: object) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], cwd=tmp_path,
                            **kw)  # type: ignore[call-overload]


def _wait_file(path: Path, timeout_s: float = 15) -> str:
    deadline = time.monotonic() + timeout_s
    while not path.exists() or not path.read_text().strip():
        assert time.monotonic() < deadline, f"{path} never written"
        time.sleep(0.05)
    return path.read_text().strip()


def test_terminate_stops_the_group_and_a_child_in_its_own_session(tmp_path: Path) -> None:
    leader = _python("""
        import subprocess, time
        p = subprocess.Popen(["sleep", "300"], start_new_session=True)  # torchrun's ranks do this
        open("child", "w").write(str(p.pid))
        time.sleep(300)
    """, tmp_path, start_new_session=True)
    child = int(_wait_file(tmp_path / "child"))
    handle = proctree.ProcessGroupHandle(pid=leader.pid, popen=leader)
    started = time.monotonic()
    handle.terminate(grace_s=5)
    assert time.monotonic() - started < 5, "SIGTERM ended both: no wait for the grace"
    assert gone(leader.pid) and gone(child)
    handle.terminate(grace_s=1)  # twice is safe


def test_subreaper_stops_a_double_forked_daemon(tmp_path: Path) -> None:
    """The attempt loop's end of attempt: a daemon that left the tree (its parent gone) is re-parented
    to the subreaper and stopped, a SIGTERM-ignoring one by SIGKILL after the grace."""
    (tmp_path / "daemonize.py").write_text(textwrap.dedent("""
        import os, signal, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
                open("daemon", "w").write(str(os.getpid()))
                time.sleep(300)
            os._exit(0)
        os._exit(0)
    """))
    loop = _python("""
        import os, subprocess, sys, time
        from service.run import proctree
        assert proctree.become_subreaper()
        subprocess.run([sys.executable, "daemonize.py"], check=True)
        while not os.path.exists("daemon") or not open("daemon").read():
            time.sleep(0.02)
        found = proctree.stop_descendants(grace_s=0.5)
        open("found", "w").write(" ".join(map(str, found)))
    """, tmp_path, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert loop.wait(timeout=60) == 0
    daemon = int(_wait_file(tmp_path / "daemon"))
    assert str(daemon) in _wait_file(tmp_path / "found").split()
    assert gone(daemon, 2)


def test_kill_tree_kills_at_once_without_waiting(tmp_path: Path) -> None:
    leader = _python("""
        import signal, subprocess, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        p = subprocess.Popen(["sleep", "300"])
        open("child", "w").write(str(p.pid))
        time.sleep(300)
    """, tmp_path)
    child = int(_wait_file(tmp_path / "child"))
    proctree.kill_tree(leader.pid)
    assert leader.wait(timeout=10) == -signal.SIGKILL
    assert gone(child)


def test_a_child_dies_with_its_parent(tmp_path: Path) -> None:
    parent = _python("""
        import os, signal, time
        from service.run import proctree
        me = os.getpid()
        pid = os.fork()
        if pid == 0:
            assert proctree.die_with_parent(signal.SIGKILL, me)
            open("child", "w").write(str(os.getpid()))
            time.sleep(300)
            os._exit(0)
        time.sleep(300)
    """, tmp_path, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    child = int(_wait_file(tmp_path / "child"))
    parent.kill()
    parent.wait()
    assert gone(child)
    # Armed after the parent is gone: says so, the caller ends itself.
    assert proctree.die_with_parent(signal.SIGTERM, os.getppid() + 10**6) is False


def test_prctl_starts_no_process(tmp_path: Path) -> None:
    """The attempt loop marks itself a subreaper on every job's start: through the C library already
    loaded, never ``ctypes.util.find_library`` (which runs ``ldconfig -p``)."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import subprocess
        from service.run import proctree
        def refuse(*a, **k):
            raise AssertionError(f"started a process: {a}")
        subprocess.Popen.__init__ = refuse
        assert proctree.become_subreaper()
        print("ok")
    """)], capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_an_adopted_attempt_loops_exit_wakes_the_supervisor_at_once(tmp_path: Path) -> None:
    """After a restart the attempt loop is not the server's child: its exit still wakes the loop
    (a pidfd), not the next poll."""
    proc = subprocess.Popen(["sleep", "0.5"])
    executor = LocalExecutor()
    woken = threading.Event()
    executor.watch(woken.set)
    reference = encode_reference(proc.pid, proctree.create_time(proc.pid))
    assert executor.adopt(reference)
    assert not woken.is_set()
    assert woken.wait(timeout=10), "the adopted process's exit was not told"
    assert proc.poll() is not None or psutil.Process(proc.pid).status() == psutil.STATUS_ZOMBIE
    proc.wait()
