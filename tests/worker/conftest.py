"""Fixtures of the rank package's tests: a warm server for plain torchrun groups."""

from collections.abc import Iterator

import pytest

from service.settings import Settings
from tests.conftest import REPO_ROOT
from tests.warmserver import running_warm_server
from tests.worker.rungroup import environment


@pytest.fixture(scope="session")
def warm_ranks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A warm server for the plain groups of test_checkpoint and test_worker_unit (one xdist
    group, ``rungroup``: tests/conftest.py), with the product's own preload: its socket."""
    preload = Settings.model_fields["warm_preload"].default
    with running_warm_server(tmp_path_factory.mktemp("rungroup-warm"), 3, preload,
                             environment(), cwd=REPO_ROOT) as path:
        yield path
