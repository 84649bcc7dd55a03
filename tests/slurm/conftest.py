"""The Slurm tests' module server: one Slurm-executor server per test file, for the tests that
neither kill it nor need settings of their own (their rank hooks are per job: ``hooks``). It runs
script jobs too: API tokens (``server.token``, sent by ``client()``) and a script directory
beside its home (``tests.conftest.add_script``)."""

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import LiveServer, module_slurm_server
from tests.slurmcluster import SlurmCluster

MODULE_API_TOKEN = "slurm-module-server-api-token-0123456789"


@pytest.fixture(scope="module")
def _module_server(
    slurm: SlurmCluster, tmp_path_factory: pytest.TempPathFactory, _migrated_sqlite: Path
) -> Iterator[LiveServer]:
    root = tmp_path_factory.mktemp("slurm-module")
    (root / "scripts").mkdir()
    with module_slurm_server(slurm, root / "home", _migrated_sqlite,
                             TORCHYARD_SCRIPT_DIRS=str(root / "scripts"),
                             TORCHYARD_API_TOKENS=MODULE_API_TOKEN) as server:
        yield server


@pytest.fixture
def server(slurm: SlurmCluster, _module_server: LiveServer) -> LiveServer:
    """The module's server; a failed earlier test's jobs still in Slurm are cancelled first."""
    slurm.cancel_all()
    return _module_server
