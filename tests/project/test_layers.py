"""The dependency rule holds: import-linter's contracts in pyproject.toml ([tool.importlinter]).

Request path → domain → store; the domain reaches executors only through their Protocol; the run
side and the ranks import only the contract; the server never imports torch
(docs/architecture.md). A new import that breaks a layer fails here, naming the import chain.
"""

import subprocess
import sys

from tests.conftest import REPO_ROOT


def test_every_import_contract_is_kept() -> None:
    run = subprocess.run(
        [sys.executable, "-c",
         "import sys; from importlinter.cli import lint_imports_command; "
         "sys.exit(lint_imports_command())", "--no-cache"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
    )
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    assert "0 broken" in run.stdout
