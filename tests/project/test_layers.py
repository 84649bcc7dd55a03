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


# Sizes the layout keeps (issue 45): a folder a reader takes in at a glance, a module read in one
# sitting. A folder or module past them is a concern to split, not a number to raise.
DOMAIN_FOLDER_MAX = 12
FOLDER_MAX = 16
MODULE_LINES_MAX = 400


def test_folders_and_modules_stay_small() -> None:
    too_many, too_long = [], []
    for folder in [REPO_ROOT / "service", *(REPO_ROOT / "service").rglob("*/")]:
        if not folder.is_dir() or folder.name == "__pycache__" or "node_modules" in folder.parts:
            continue
        modules = [p for p in folder.glob("*.py") if p.name != "__init__.py"]
        limit = DOMAIN_FOLDER_MAX if "domain" in folder.relative_to(REPO_ROOT).parts else FOLDER_MAX
        if len(modules) > limit:
            too_many.append(f"{folder.relative_to(REPO_ROOT)}: {len(modules)} modules > {limit}")
    for top in ("service", "torchyard_contract", "worker"):
        for path in (REPO_ROOT / top).rglob("*.py"):
            if (lines := len(path.read_text().splitlines())) > MODULE_LINES_MAX:
                too_long.append(f"{path.relative_to(REPO_ROOT)}: {lines} lines")
    assert not too_many and not too_long, too_many + too_long
