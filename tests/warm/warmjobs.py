"""What the tests of jobs with warm ranks share (tests/warm/, and the warm cases of tests/run/,
tests/worker/, tests/packages/ and tests/lifecycle/): the settings that turn warm ranks on, waiting
for the pool, and a job's rank logs."""

import time

from tests.conftest import LiveServer

WARM_ENV = {"TORCHYARD_WARM_RANKS": "true", "TORCHYARD_WARM_POOL_SIZE": "3"}
WARM_READY_TIMEOUT_S = 240.0  # importing torch + torchvision on a loaded 2-core machine


def wait_warm(server: LiveServer, idle: int = 3) -> dict:
    """Block until the pool is ready with ``idle`` processes; returns its /resources entry."""
    deadline = time.monotonic() + WARM_READY_TIMEOUT_S
    with server.client() as c:
        while True:
            warm = c.get("/resources").json()["warm"]
            assert warm is not None, "warm ranks are off"
            if warm["state"] == "ready" and warm["idle"] >= idle:
                return warm
            assert time.monotonic() < deadline, f"the warm pool is not ready: {warm}"
            time.sleep(0.3)


def wait_served(server: LiveServer, at_least: int, timeout_s: float = 30) -> dict:
    """Until the pool has handed off ``at_least`` processes; its /resources entry. Awaited, not
    read once: /resources reports the pool as the server last polled it (every second)."""
    deadline = time.monotonic() + timeout_s
    while (warm := wait_warm(server, idle=0))["served"] < at_least:
        assert time.monotonic() < deadline, warm
        time.sleep(0.2)
    return warm


def rank_logs(server: LiveServer, job_id: int) -> str:
    root = server.home / "runs" / str(job_id) / "logs"
    return "".join(p.read_text() for p in sorted(root.glob("**/*.log")))
