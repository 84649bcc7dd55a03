"""An idle server's supervisor: a pass with nothing unfinished is one read, never a write.

A server mostly waits for work; before this, each 0.2 s pass opened a write transaction per step
(about 2 % of a core per idle server, and a write lock taken five times a second)."""

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from fastapi.testclient import TestClient
from sqlalchemy import event
from sqlalchemy.engine import Engine

from service.app import create_app
from service.settings import Settings

POLL_S = 0.05
WRITES = ("BEGIN IMMEDIATE", "INSERT", "UPDATE", "DELETE")
# The one read of an idle pass (``Supervisor._idle``: anything unfinished?), first in each pass.
IDLE_CHECK = "SELECT (EXISTS (SELECT * FROM jobs WHERE"
IDLE_PASSES = 3


@contextmanager
def _supervisor_statements() -> Iterator[list[str]]:
    """The SQL the supervisor's thread runs while the block runs (from before it starts)."""
    seen: list[str] = []

    def record(conn, cursor, statement, parameters, context, executemany) -> None:  # type: ignore[no-untyped-def]
        if threading.current_thread().name == "torchyard-supervisor":
            seen.append(" ".join(statement.split())[:60])

    event.listen(Engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(Engine, "before_cursor_execute", record)


def _idle_passes(seen: list[str], passes: int, timeout_s: float = 60) -> list[list[str]]:
    """The statements of the first ``passes`` idle passes, each from its idle check to the next
    one (plain ``BEGIN``s left out), once the loop has run them: everything the term's first,
    full pass did (recovery, the first publish, a clean-up) is before the first idle check."""
    deadline = time.monotonic() + timeout_s
    while len(checks := [i for i, s in enumerate(seen) if s.startswith(IDLE_CHECK)]) <= passes:
        assert time.monotonic() < deadline, f"{len(checks)} idle passes in {timeout_s} s: {seen}"
        time.sleep(POLL_S)
    ran = list(seen)
    bounds = zip(checks[:passes], checks[1:passes + 1], strict=True)
    return [[s for s in ran[a:b] if s != "BEGIN"] for a, b in bounds]


def test_an_idle_pass_is_one_read_and_a_busy_one_still_acts(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path / "home", cpu_slots=2, gpus="none",
                        poll_interval_s=POLL_S, warm_ranks=False)
    with _supervisor_statements() as seen, TestClient(create_app(settings)) as client:
        passes = _idle_passes(seen, IDLE_PASSES)
        first_pass = seen[:seen.index(passes[0][0])]
        assert any(s.upper().startswith(WRITES) for s in first_pass), \
            "the term's first pass wrote (it published the empty queue) before the idle ones"
        for statements in passes:
            assert not [s for s in statements if s.upper().startswith(WRITES)], passes
            # Its idle check, and at most one more read: the scheduling pass of every 2 s.
            assert 1 <= len(statements) <= 2, passes
        # Not idle: a job that can never start (3 slots on a 2-slot host) is refused at submit,
        # so a startable one is queued; the supervisor then writes (it launches, or fails it).
        job = client.post("/jobs", json={"dataset": "synthetic", "epochs": 1,
                                         "nproc_per_node": 2}).json()
        deadline = time.monotonic() + 20
        while client.get(f"/jobs/{job['id']}").json()["state"] == "queued":
            assert time.monotonic() < deadline, "the supervisor never acted on the queued job"
            time.sleep(POLL_S)
        client.post(f"/jobs/{job['id']}/cancel")
