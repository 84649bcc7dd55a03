"""An idle server's supervisor: a pass with nothing unfinished is one read, never a write.

A server mostly waits for work; before this, each 0.2 s pass opened a write transaction per step
(about 2 % of a core per idle server, and a write lock taken five times a second)."""

import threading
import time
from pathlib import Path

from fastapi.testclient import TestClient
from sqlalchemy import event
from sqlalchemy.engine import Engine

from service.app import create_app
from service.settings import Settings
from service.store import queue as queuerepo

POLL_S = 0.05
WRITES = ("BEGIN IMMEDIATE", "INSERT", "UPDATE", "DELETE")


def _supervisor_statements(seconds: float, client: TestClient) -> list[str]:
    """The SQL the supervisor's thread ran during ``seconds`` (after a first idle pass)."""
    _await_first_publish(client)
    seen: list[str] = []

    def record(conn, cursor, statement, parameters, context, executemany) -> None:  # type: ignore[no-untyped-def]
        if threading.current_thread().name == "torchyard-supervisor":
            seen.append(" ".join(statement.split())[:60])

    time.sleep(3 * POLL_S)  # a pass or so more: reads only from here on
    event.listen(Engine, "before_cursor_execute", record)
    try:
        time.sleep(seconds)
    finally:
        event.remove(Engine, "before_cursor_execute", record)
    return seen


def _await_first_publish(client: TestClient, timeout_s: float = 30) -> None:
    """Until the supervisor has taken the lease and published its first (empty) queue: the
    writes of a term's start, not of an idle pass (on a loaded host they came after a fixed
    0.15 s wait, inside the window: 4 xdist workers on 2 cores, 2026-12-07)."""
    deadline = time.monotonic() + timeout_s
    while True:
        with client.app.state.session_factory() as session:
            if (queuerepo.snapshot_version(session) or 0) > 0:
                return
        assert time.monotonic() < deadline, "no queue snapshot published"
        time.sleep(POLL_S)


def test_an_idle_pass_is_one_read_and_a_busy_one_still_acts(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path / "home", cpu_slots=2, gpus="none",
                        poll_interval_s=POLL_S, warm_ranks=False)
    with TestClient(create_app(settings)) as client:
        seconds = 1.5
        idle = _supervisor_statements(seconds, client)
        assert not [s for s in idle if s.upper().startswith(WRITES)], idle
        # One read per pass (at most seconds / POLL_S of them), plus a scheduling pass every 2 s;
        # a read transaction's plain BEGIN is not counted.
        reads = [s for s in idle if s != "BEGIN"]
        assert 0 < len(reads) <= seconds / POLL_S + 6, reads
        # Not idle: a job that can never start (3 slots on a 2-slot host) is refused at submit,
        # so a startable one is queued; the supervisor then writes (it launches, or fails it).
        job = client.post("/jobs", json={"dataset": "synthetic", "epochs": 1,
                                         "nproc_per_node": 2}).json()
        deadline = time.monotonic() + 20
        while client.get(f"/jobs/{job['id']}").json()["state"] == "queued":
            assert time.monotonic() < deadline, "the supervisor never acted on the queued job"
            time.sleep(POLL_S)
        client.post(f"/jobs/{job['id']}/cancel")
