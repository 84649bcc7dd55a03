"""``service.run.ranktee``: a rank's two streams kept apart and together, its exit passed through."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from tests.conftest import REPO_ROOT
from torchyard_contract.rundir import RunDir


def _start(run: RunDir, code: str, out: Path, err: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "RANK": "3", "PYTHONUNBUFFERED": "1"}
    with out.open("wb") as o, err.open("wb") as e:
        return subprocess.Popen(
            [sys.executable, "-m", "service.run.ranktee", "--run-dir", str(run.root), "--attempt", "2",
             "--", "-c", code],
            cwd=REPO_ROOT, env=env, stdout=o, stderr=e,
        )


def test_both_streams_in_write_order_and_each_apart(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "run")
    code = ("import sys, time\n"
            "print('first out'); time.sleep(0.3)\n"
            "sys.stderr.write('then err\\n'); time.sleep(0.3)\n"
            "print('last out', 'é')\n"
            "sys.exit(3)\n")
    proc = _start(run, code, tmp_path / "stdout.log", tmp_path / "stderr.log")
    assert proc.wait(timeout=60) == 3, "the program's exit code"
    assert (tmp_path / "stdout.log").read_text() == "first out\nlast out é\n"
    assert (tmp_path / "stderr.log").read_text() == "then err\n"
    combined = run.rank_output(2, 3)
    assert combined == run.logs_dir / "attempt-2" / "rank-3.log"
    assert combined.read_text() == "first out\nthen err\nlast out é\n"


def test_a_signal_reaches_the_program_and_its_death_is_passed_on(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "run")
    code = "import time\nprint('ready', flush=True)\ntime.sleep(120)\n"
    proc = _start(run, code, tmp_path / "o", tmp_path / "e")
    combined = run.rank_output(2, 3)
    deadline = time.monotonic() + 60
    while not (combined.exists() and "ready\n" in combined.read_text()):
        assert time.monotonic() < deadline, "the program did not start"
        time.sleep(0.1)
    (child,) = psutil.Process(proc.pid).children()
    proc.send_signal(signal.SIGTERM)  # the wrapper only: it passes the signal on
    assert proc.wait(timeout=30) == -signal.SIGTERM, "died of the program's signal"
    assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE
    assert combined.read_text() == "ready\n"


def test_death_by_sigkill_is_passed_on(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "run")
    code = "import os, signal\nprint('bye')\nos.kill(os.getpid(), signal.SIGKILL)\n"
    proc = _start(run, code, tmp_path / "o", tmp_path / "e")
    assert proc.wait(timeout=60) == -signal.SIGKILL
    assert run.rank_output(2, 3).read_text() == "bye\n"
