"""The Slurm tests' module server: one Slurm-executor server per test file, for the tests that
neither kill it nor need settings of their own (their rank hooks are per job: ``hooks``)."""

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import LiveServer, module_slurm_server
from tests.slurmcluster import SlurmCluster


@pytest.fixture(scope="module")
def _module_server(
    slurm: SlurmCluster, tmp_path_factory: pytest.TempPathFactory, _migrated_sqlite: Path
) -> Iterator[LiveServer]:
    home = tmp_path_factory.mktemp("slurm-module") / "home"
    with module_slurm_server(slurm, home, _migrated_sqlite) as server:
        yield server


@pytest.fixture
def server(slurm: SlurmCluster, _module_server: LiveServer) -> LiveServer:
    """The module's server; a failed earlier test's jobs still in Slurm are cancelled first."""
    slurm.cancel_all()
    return _module_server
