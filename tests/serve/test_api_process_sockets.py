"""``torchyard serve --workers N`` as processes (``service.serve``): new connections spread
over every API process, an API process that dies is replaced, and no API process outlives its parent."""

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from bench.loadgen import Connection
from tests.conftest import LiveServer, _copy_sqlite, _start_server, _stop_server

pytestmark = pytest.mark.slow
CONNECTIONS = 40
# No job runs in this file: no warm pool to start (~3.5 CPU s a server).
NO_WARM = {"TORCHYARD_WARM_RANKS": "false"}
WORKERS_2 = ("--workers", "2")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, _migrated_sqlite: Path) -> Iterator[LiveServer]:
    """``serve --workers 2`` for the tests that leave it and its API processes alone (those that kill
    the parent or an API process start their own)."""
    home = tmp_path_factory.mktemp("api") / "home"
    _copy_sqlite(_migrated_sqlite, home)
    live = _start_server(home, NO_WARM, args=WORKERS_2)
    yield live
    _stop_server(live)


def _api_processes(server: LiveServer) -> list[psutil.Process]:
    """The API processes (not multiprocessing's resource tracker)."""
    children = psutil.Process(server.proc.pid).children()
    return [p for p in children if "spawn_main" in " ".join(p.cmdline())]


def _roles_over_new_connections(server: LiveServer) -> Counter[str]:
    """``/healthz`` roles answered over ``CONNECTIONS`` TCP connections opened at once, as a
    page of dashboards or a burst of ranks opens them."""

    async def burst() -> list[str]:
        conns = [Connection("127.0.0.1", server.port) for _ in range(CONNECTIONS)]
        try:
            answers = await asyncio.gather(*(c.request("GET", "/healthz") for c in conns))
        finally:
            await asyncio.gather(*(c.close() for c in conns))
        return [body["role"] for _status, body in answers]

    return Counter(asyncio.run(burst()))


def _until(condition, timeout_s: float, what: str):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not (result := condition()):
        assert time.monotonic() < deadline, f"timed out: {what}"
        time.sleep(0.3)
    return result


def test_connections_reach_every_api_process_and_a_dead_one_is_replaced(
    live_server_factory,  # type: ignore[no-untyped-def]
) -> None:
    server: LiveServer = live_server_factory(_args=WORKERS_2, **NO_WARM)
    first = _until(lambda: len(_api_processes(server)) == 2 and _api_processes(server), 30, "two API processes")
    # Exactly one API process supervises; both take connections (a shared accept socket gave a
    # burst of connections all to one API process).
    roles = _until(lambda: (r := _roles_over_new_connections(server))["supervisor"] and r,
                   30, "a supervisor")
    assert roles["standby"] > 0 and roles["supervisor"] > 0, roles
    assert roles["supervisor"] + roles["standby"] == CONNECTIONS

    victim = first[0]
    victim.send_signal(signal.SIGKILL)
    victim.wait(10)
    replaced = _until(
        lambda: len(w := _api_processes(server)) == 2 and victim.pid not in {p.pid for p in w} and w,
        30, "a new API process",
    )
    assert server.proc.poll() is None
    # The replacement serves too, and one of the two supervises (a standby takes the lease of a
    # killed supervisor within its TTL).
    roles = _until(
        lambda: (r := _roles_over_new_connections(server))["supervisor"]
        and r["standby"] and r, 30, "both roles again",
    )
    assert sum(roles.values()) == CONNECTIONS
    assert {p.pid for p in replaced} != {p.pid for p in first}
    assert "exited with -9" in server.log.read_text()


@pytest.mark.parametrize("parent_signal", [signal.SIGTERM, signal.SIGKILL])
def test_api_processes_do_not_outlive_the_parent(
    live_server_factory, parent_signal: signal.Signals,  # type: ignore[no-untyped-def]
) -> None:
    server: LiveServer = live_server_factory(_args=WORKERS_2, **NO_WARM)
    processes = _until(lambda: len(_api_processes(server)) == 2 and _api_processes(server), 30, "two API processes")
    os.kill(server.proc.pid, parent_signal)
    server.proc.wait(30)
    if parent_signal == signal.SIGTERM:
        assert server.proc.returncode == 0
    # SIGTERM: the parent stops them; SIGKILL: their parent-death signal does (they drain).
    gone, alive = psutil.wait_procs(processes, timeout=20)
    assert not alive, [p.pid for p in alive]
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{server.url}/healthz", timeout=2)


def test_a_second_server_cannot_share_the_port(server: LiveServer, tmp_path: Path) -> None:
    # SO_REUSEPORT would let it bind and silently take half of the first one's connections.
    env = {**os.environ, "TORCHYARD_HOME": str(tmp_path / "other"), "TORCHYARD_GPUS": "none"}
    second = subprocess.run(
        [sys.executable, "-m", "service", "serve", "--workers", "2", "--port", str(server.port)],
        env=env, capture_output=True, text=True, timeout=60,
    )
    assert second.returncode != 0
    assert f"cannot listen on 127.0.0.1:{server.port}" in second.stderr
    assert _api_processes(server) and server.proc.poll() is None


def _healthz_count(text: str) -> float:
    """``torchyard_http_request_duration_seconds_count`` summed over /healthz's label sets."""
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
        if line.startswith("torchyard_http_request_duration_seconds_count{")
        and 'route="/healthz"' in line
    )


def test_every_scrape_counts_every_api_process_requests(server: LiveServer) -> None:
    # A scrape lands on one API process; per-process counters would show that API process's share only
    # and jump between scrapes (read by Prometheus as resets). The counts are since the
    # server's start: the module's earlier tests' requests only add to them.
    _until(lambda: len(_api_processes(server)) == 2, 30, "two API processes")
    roles = _until(lambda: (r := _roles_over_new_connections(server))["standby"]
                   and r["supervisor"] and r, 30, "both API processes answering")
    served = sum(roles.values())
    counts = []
    for _ in range(12):  # new connections: scrapes land on both API processes
        with httpx.Client(base_url=server.url, timeout=10) as c:
            counts.append(_healthz_count(c.get("/metrics").text))
    assert min(counts) >= served, counts
    assert counts == sorted(counts), f"a counter went down between scrapes: {counts}"
