"""Fixtures of the rank package's tests: a warm server for plain torchrun groups."""

import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from service.executor.warmpool import ask, build_server_command, socket_path
from service.settings import Settings
from tests.conftest import REPO_ROOT
from tests.worker.rungroup import environment


@pytest.fixture(scope="module")
def warm_ranks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A warm server for this module's groups: its socket path."""
    home = tmp_path_factory.mktemp("rungroup-warm")
    path = socket_path(home)
    preload = Settings.model_fields["warm_preload"].default  # the product's own preload
    argv = build_server_command(sys.executable, path, 3, preload, os.getpid())
    log = home / "server.log"
    proc = subprocess.Popen(argv, env=environment(), cwd=REPO_ROOT, stdout=log.open("wb"),
                            stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 120
    while ask(path, {"op": "status"}) is None:
        assert proc.poll() is None, log.read_text()
        assert time.monotonic() < deadline, "the warm server did not start"
        time.sleep(0.1)
    yield path
    ask(path, {"op": "drain"})
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
