"""bench.common.run_baseline: a baseline that fails once (torch's own teardown abort) runs once
more; one that fails twice raises with its log. Real interpreters."""

import os
import sys
from pathlib import Path

import pytest

from bench.common import run_baseline

# Fails (exit 3, after a line of output) on its first run in a directory, succeeds on the next.
FLAKY = ("import os, sys\n"
         "if not os.path.exists('ran'):\n"
         "    open('ran', 'w').close(); print('first try aborts'); sys.exit(3)\n")


def test_a_baseline_failing_once_runs_again_and_its_times_are_the_second_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    started, ended = run_baseline([sys.executable, "-c", FLAKY], tmp_path, os.environ)
    assert started <= ended
    assert "exited 3; once more" in capsys.readouterr().err
    assert "first try aborts" not in (tmp_path / "baseline.log").read_text()  # the second run's


def test_a_baseline_failing_twice_raises_with_its_log(tmp_path: Path) -> None:
    argv = [sys.executable, "-c", "print('boom from the baseline'); raise SystemExit(5)"]
    with pytest.raises(RuntimeError, match=r"(?s)exited 5 twice.*boom from the baseline"):
        run_baseline(argv, tmp_path, os.environ)
