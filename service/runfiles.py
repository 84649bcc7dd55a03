"""Reading what a job's shim wrote (attempt records, the outcome), tolerant of missing files."""

from __future__ import annotations

import json
from pathlib import Path

from torchyard_contract.rundir import RunDir


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def read_attempts(run: RunDir) -> list[dict]:
    """Attempt records in number order (the shim writes each atomically)."""
    attempts = [read_json(p) for p in run.attempts_dir.glob("*.json")]
    return sorted((a for a in attempts if a), key=lambda a: a["number"])
