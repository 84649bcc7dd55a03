"""The contract package and the worker stay free of the server, web and SQL stacks (issue 13)."""

import json
import math
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT
from torchyard_contract.records import RecordPost, decode_value, encode_value, to_wire


def _imported(code: str) -> set[str]:
    """Top-level modules loaded after running ``code`` in a fresh interpreter."""
    probe = code + "\nimport sys, json; print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))"
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    )
    return set(json.loads(out.stdout.splitlines()[-1]))


def test_contract_imports_no_server_web_sql_or_torch() -> None:
    loaded = _imported(
        "import torchyard_contract.spec, torchyard_contract.records, "
        "torchyard_contract.rundir, torchyard_contract.envnames"
    )
    assert not loaded & {"service", "worker", "fastapi", "starlette", "sqlalchemy", "torch"}


@pytest.mark.parametrize("module", ["worker", "worker.train", "worker.reporter", "worker.checkpoint"])
def test_worker_never_imports_the_server(module: str) -> None:
    loaded = _imported(f"import {module}")
    assert not loaded & {"service", "fastapi", "starlette", "sqlalchemy"}


def test_a_server_start_imports_neither_torch_nor_the_numeric_stack() -> None:
    # What ``torchyard serve`` imports before it answers: numpy, tsdownsample (charts) and
    # optuna (sweeps) load on first use, so a start (and every ``--workers`` process) skips them.
    loaded = _imported("import service.cli, service.app, service.api.drain")
    assert not loaded & {"torch", "numpy", "tsdownsample", "optuna", "sklearn"}


def test_one_nonfinite_codec_round_trips() -> None:
    for value in (math.inf, -math.inf, 1.5, 0.0):
        assert decode_value(to_wire(value)) == value
    assert math.isnan(decode_value(to_wire(math.nan)))
    assert [encode_value(v) for v in (math.nan, True, 3)] == ["NaN", 1, 3]
    record = RecordPost.model_validate({"rank": 0, "name": "loss", "value": "-Infinity", "time": 1})
    assert record.value == -math.inf
