"""Module paths from before the layout change still run, for one release: an attempt loop started
before an upgrade (``python -m service.shim``), the ranks its torchrun starts next attempt
(``python -m service.ranktee``, ``python service/warm/relay.py``), a Slurm batch script queued
before it. Each stub must run the new code, not merely import."""

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO_ROOT
from torchyard_contract.rundir import RunDir


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *argv], cwd=cwd, capture_output=True, text=True,
                          timeout=60, env={**os.environ, "RANK": "1"})


def test_service_shim_runs_the_attempt_loop(tmp_path: Path) -> None:
    done = _run(["-m", "service.shim", "--help"], REPO_ROOT)
    assert done.returncode == 0, done.stderr
    assert "RUN_DIR" in done.stdout or "run_dir" in done.stdout


def test_service_ranktee_runs_the_rank_tee(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "run")
    done = _run(["-m", "service.ranktee", "--run-dir", str(run.root), "--attempt", "1", "--",
                 "-c", "print('through the stub'); raise SystemExit(4)"], REPO_ROOT)
    assert done.returncode == 4
    assert run.rank_output(1, 1).read_text() == "through the stub\n"


def test_old_relay_path_runs_the_relay(tmp_path: Path) -> None:
    # No warm server at that socket: the relay goes cold and runs the program itself.
    done = _run([str(REPO_ROOT / "service" / "warm" / "relay.py"), str(tmp_path / "none.sock"),
                 "-c", "print(6 * 7)"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "42"
    assert "starting cold" in done.stderr
