"""The local executor's verbs on real process groups (no torchrun: a sleeping tree stands in)."""

import subprocess
import sys
import time
from pathlib import Path

import psutil

from service.executor.base import Phase, Submission
from service.executor.local import LocalExecutor
from service.executor.reference import decode_reference, encode_reference
from service.run.proctree import create_time, start_ticks
from torchyard_contract.rundir import RunDir

# A leader in its own session with a child that starts a session of its own, as torchrun's ranks do.
TREE = (
    "import subprocess, sys, time\n"
    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], start_new_session=True)\n"
    "time.sleep(60)\n"
)


def _kill_all(pids: list[int]) -> None:
    for pid in pids:
        try:
            psutil.Process(pid).kill()
        except psutil.Error:
            pass


def _start_tree() -> tuple[subprocess.Popen[bytes], list[int]]:
    leader = subprocess.Popen([sys.executable, "-c", TREE], start_new_session=True)
    deadline = time.monotonic() + 20
    while not psutil.Process(leader.pid).children():
        assert time.monotonic() < deadline, "child never started"
        time.sleep(0.05)
    return leader, [leader.pid, *(c.pid for c in psutil.Process(leader.pid).children())]


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_dry_run_is_pure_and_withholds_values(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "7")
    sub = Submission(job_id=7, run=run, env={"TORCHYARD_JOB_TOKEN": "secret"}, nproc_per_node=2)
    plan = LocalExecutor(python="/usr/bin/python3").dry_run(sub)
    assert plan.argv == ("/usr/bin/python3", "-m", "service.run.attemptloop", str(run.root))
    assert plan.env_names == ("TORCHYARD_JOB_TOKEN",) and "secret" not in repr(plan)
    assert not run.root.exists(), "a dry run touches nothing"


def test_adopt_describe_cancel_by_reference() -> None:
    leader, pids = _start_tree()
    try:
        ref = encode_reference(leader.pid, create_time(leader.pid))
        executor = LocalExecutor()  # a fresh one: as after a server restart
        assert executor.adopt(ref)
        assert executor.describe({1: ref})[1].phase is Phase.running
        executor.cancel(ref, grace_s=2)
        leader.wait(timeout=10)
        deadline = time.monotonic() + 10
        while not all(_gone(p) for p in pids):
            assert time.monotonic() < deadline, f"left behind: {[p for p in pids if not _gone(p)]}"
            time.sleep(0.05)
        status = executor.describe({1: ref})[1]
        assert (status.phase, status.exit_code) == (Phase.ended, None)  # not our child: code lost
        executor.cancel(ref, grace_s=1)  # idempotent
        assert not executor.adopt(ref)
    finally:
        _kill_all(pids)


def test_a_reused_pid_is_never_adopted_or_signalled() -> None:
    leader, pids = _start_tree()
    try:
        started = create_time(leader.pid)
        assert started is not None
        stale = encode_reference(leader.pid, started - 100)  # same pid, another process's start
        executor = LocalExecutor()
        assert not executor.adopt(stale)
        assert executor.describe({1: stale})[1].phase is Phase.ended
        executor.cancel(stale, grace_s=0)
        assert leader.poll() is None, "a process that merely reuses the pid was signalled"
        assert decode_reference("not json") is None and not executor.adopt("12")
    finally:
        _kill_all(pids)
        leader.wait(timeout=10)


def test_a_clock_step_does_not_lose_an_adopted_attempt_loop() -> None:
    """Linux derives every create time from the wall clock at each read: after an NTP step or a
    VM's clock step the attempt loop's create time reads whole seconds off what its reference holds. Its
    start in ticks since boot does not move, so it is still adopted, described running and
    cancelled; a reference with another start in ticks (a reused pid) is none of these."""
    leader, pids = _start_tree()
    try:
        started, ticks = create_time(leader.pid), start_ticks(leader.pid)
        assert started is not None and ticks is not None
        stepped = encode_reference(leader.pid, started - 3.0, "host", ticks)
        assert decode_reference(stepped) == (leader.pid, started - 3.0, ticks)
        executor = LocalExecutor()
        assert executor.adopt(stepped)
        assert executor.describe({1: stepped})[1].phase is Phase.running
        reused = encode_reference(leader.pid, started, "host", ticks + 1)
        assert not LocalExecutor().adopt(reused)
        assert LocalExecutor().describe({1: reused})[1].phase is Phase.ended
        LocalExecutor().cancel(reused, grace_s=0)
        assert leader.poll() is None, "a process with another start was signalled"
        executor.cancel(stepped, grace_s=2)
        assert leader.wait(timeout=10) is not None
    finally:
        _kill_all(pids)


def test_a_reference_from_a_claim_keeps_the_start_ticks() -> None:
    """The claim the attempt loop writes first thing carries ``start_ticks``; the reference recovery
    builds from it keeps them, and a claim from before them still gives a reference."""
    executor = LocalExecutor()
    ref = executor.reference_from_claim({"pid": 42, "create_time": 1.5, "host": "h", "start_ticks": 7})
    assert ref is not None and decode_reference(ref) == (42, 1.5, 7)
    old = executor.reference_from_claim({"pid": 42, "create_time": 1.5, "host": "h"})
    assert old is not None and decode_reference(old) == (42, 1.5, None)
