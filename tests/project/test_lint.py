"""The code stays clean under the rule set pyproject.toml selects (``[tool.ruff.lint]``)."""

import subprocess
import sys

from tests.conftest import REPO_ROOT


def test_ruff_finds_nothing() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "."],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
