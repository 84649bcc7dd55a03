"""A warm server (``service.run.warm.server``) run by a test fixture: started, awaited, drained."""

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from service.executor.warmpool import ask, build_server_command, socket_path


@contextmanager
def running_warm_server(home: Path, pool: int, preload: list[str], env: dict[str, str],
                        cwd: Path | None = None) -> Iterator[str]:
    """Start a warm server in ``home`` with ``env``; yield its socket path once it answers;
    drain it after (a server that does not drain within 15 s fails the test)."""
    path = socket_path(home)
    argv = build_server_command(sys.executable, path, pool, preload, os.getpid())
    log = home / "server.log"
    proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=log.open("wb"),
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
        pytest.fail("the warm server did not drain")
