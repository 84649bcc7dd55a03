"""Every read of a run-directory file goes through ``torchyard_contract.safefile`` (and every
open for writing through ``runwrite``): the launch configuration, the claim, an attempt record
read back, a hang's stacks, the nodes' stack answers, the spare attempt loop's log. A job can
write in its run directory, so a link it planted there is never followed, a FIFO never
blocks, and a file past its bound is never read whole."""

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from service.run import stackdump
from tests.conftest import REPO_ROOT
from torchyard_contract.claim import read_claim
from torchyard_contract.launch import LaunchConfig
from torchyard_contract.rundir import RunDir
from torchyard_contract.runfiles import AttemptFile, made, read_attempts, write_run_file


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A file of the server's, outside the run directory, that a job would like read."""
    path = tmp_path / "elsewhere.json"
    path.write_text(json.dumps({"pid": 1, "create_time": 0.0, "host": "h"}))
    return path


@pytest.fixture
def run(tmp_path: Path) -> RunDir:
    run = RunDir(tmp_path / "run")
    run.prepare()
    return run


def _config() -> LaunchConfig:
    return LaunchConfig(job_id=1, python=sys.executable, nproc_per_node=1, max_restarts=0,
                        max_runtime_s=None, heartbeat_timeout_s=None, stop_grace_s=1.0)


def test_a_planted_claim_link_or_fifo_is_no_claim(run: RunDir, outside: Path) -> None:
    os.symlink(outside, run.claim_file)
    assert read_claim(run) is None
    run.claim_file.unlink()
    os.mkfifo(run.claim_file)  # open() would wait for a writer forever
    done = threading.Event()
    found: list[object] = []
    threading.Thread(target=lambda: (found.append(read_claim(run)), done.set()),
                     daemon=True).start()
    assert done.wait(10), "reading the claim blocked on the job's FIFO"
    assert found == [None]
    run.claim_file.unlink()
    run.claim_file.write_text(json.dumps({"pid": 7, "padding": "x" * 100_000}))
    assert read_claim(run) is None  # past its bound: not read whole


def test_a_planted_launch_configuration_link_is_refused(run: RunDir, tmp_path: Path) -> None:
    real = RunDir(tmp_path / "other")
    real.prepare()
    _config().write(real)
    os.symlink(real.launch_file, run.launch_file)
    with pytest.raises(ValueError, match="launch.json"):
        LaunchConfig.read(run)
    run.launch_file.unlink()
    _config().write(run)
    assert LaunchConfig.read(run) == _config()


def test_a_hang_file_link_is_not_kept_with_the_attempt(run: RunDir, tmp_path: Path) -> None:
    write_run_file(run.attempt_file(1), made(AttemptFile, number=1, started_at=1.0e9,
                                             ended_at=1.0e9 + 1, exit_code=1))
    planted = tmp_path / "stacks.json"
    planted.write_text(json.dumps({"error": None, "ranks": [
        {"rank": 0, "state": "elsewhere", "collective": None, "where": "planted.py:1 in f"}]}))
    stackdump.stacks_dir(run).mkdir(parents=True)
    os.symlink(planted, stackdump.hang_file(run, 1))
    stackdump.keep_with_attempt(run, 1)
    [attempt] = read_attempts(run)
    assert attempt["stacks"] is None
    # The same content as a file of its own is kept (the test can fail).
    stackdump.hang_file(run, 1).unlink()
    stackdump.hang_file(run, 1).write_text(planted.read_text())
    stackdump.keep_with_attempt(run, 1)
    [attempt] = read_attempts(run)
    assert attempt["stacks"]["ranks"][0]["where"] == "planted.py:1 in f"


def test_the_spare_loop_never_logs_through_a_planted_link(run: RunDir, tmp_path: Path) -> None:
    target = tmp_path / "servers-own.txt"
    target.write_text("untouched\n")
    os.symlink(target, run.attempt_loop_log)
    request = json.dumps({"run": str(run.root), "env": {"PYTHONPATH": str(REPO_ROOT),
                                                        "PATH": os.environ["PATH"]}})
    done = subprocess.run([sys.executable, "-m", "service.run.attemptloop", "--spare"],
                          input=request + "\n", capture_output=True, text=True, timeout=60,
                          cwd=REPO_ROOT)
    assert done.returncode != 0 and "attempt-loop.log" in done.stderr, done.stderr
    assert target.read_text() == "untouched\n"
    assert not run.claim_file.exists()  # it ran nothing
