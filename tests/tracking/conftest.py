"""The MLflow tracking server of the session (one per xdist worker; the tracking files share one
worker: ``XDIST_GROUPS`` in tests/conftest.py). Skipped, saying why, where MLflow cannot be
installed into its own venv, except under ``CI=true`` (``.ci/run`` installs it first)."""

import os
from collections.abc import Iterator

import pytest

from tests.conftest import free_port
from tests.tracking.mlflowserver import MlflowReader, MlflowServer, ensure_venv


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    try:
        program = ensure_venv()
    except (RuntimeError, OSError) as exc:
        if os.environ.get("CI") == "true":
            raise
        pytest.skip(f"no MLflow tracking server to test against: {exc}")
    server = MlflowServer(program, tmp_path_factory.mktemp("mlflow"), free_port()).start()
    yield server
    server.stop()


@pytest.fixture
def mlflow(mlflow_server: MlflowServer) -> Iterator[MlflowReader]:
    """A reader of the session's MLflow server (its REST API)."""
    reader = MlflowReader(mlflow_server.url)
    yield reader
    reader.close()
