"""The queue against a real server and real torchrun groups: side by side, no double booking,
allocations kept across a server restart."""

import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path

import httpx
import pytest

from tests.conftest import (
    LiveServer,
    _copy_sqlite,
    _start_server,
    _stop_server,
    assert_no_slot_held_twice,
    hooks,
)

ONE_SLOT = {"dataset": "synthetic", "synthetic_samples": 64, "epochs": 2, "nproc_per_node": 1}


def _t(value: str) -> datetime:
    return datetime.fromisoformat(value)


@pytest.fixture(scope="module")
def two_slots(
    tmp_path_factory: pytest.TempPathFactory, _migrated_sqlite: Path
) -> Iterator[LiveServer]:
    """Two CPU slots, for the tests that leave the server with no unfinished job (each counts
    the slots, so none can share the session's server)."""
    home = tmp_path_factory.mktemp("two-slots") / "home"
    _copy_sqlite(_migrated_sqlite, home)
    server = _start_server(home, {"TORCHYARD_CPU_SLOTS": "2"})
    yield server
    _stop_server(server)


def test_two_slots_run_two_jobs_side_by_side_and_the_third_after(two_slots: LiveServer) -> None:
    server = two_slots
    with server.client() as c:
        ids = [c.post("/jobs", json={**ONE_SLOT, "name": f"j{i}",
                                     "labels": hooks(epoch_sleep_s=1.5)}).json()["id"]
               for i in range(3)]
        # The third waits, and says why.
        deadline = time.monotonic() + 30
        while True:
            third = c.get(f"/jobs/{ids[2]}").json()
            if third["waiting_reason"]:
                break
            assert third["state"] == "queued", third
            assert time.monotonic() < deadline, third
            time.sleep(0.1)
        assert third["waiting_reason"] == "needs 1 CPU slot; 0 free"
        assert third["queue_position"] == 1
        jobs = [server.wait_for(i, {"succeeded"}, timeout_s=180) for i in ids]
    first, second, last = jobs
    assert _t(first["started_at"]) < _t(second["ended_at"])
    assert _t(second["started_at"]) < _t(first["ended_at"]), "the first two overlap"
    assert _t(last["started_at"]) >= min(_t(first["ended_at"]), _t(second["ended_at"]))
    for job in jobs:
        phases = [job[k] for k in ("created_at", "started_at", "running_at", "first_metric_at",
                                   "ended_at")]
        assert all(phases), job
        # first_metric_at is the rank's own clock (whole microseconds); allow it to tie.
        assert [_t(p) for p in phases] == sorted(_t(p) for p in phases), job
        assert job["queue_position"] is None and job["waiting_reason"] is None


# SQLite only: one process writes, so the store's locking is not what is tested here (its
# PostgreSQL half: test_store, test_queue_snapshot; two writing processes: test_api_processes).
def test_fifty_concurrent_posts_are_all_stored_and_never_share_a_slot(
    two_slots: LiveServer,
) -> None:
    server = two_slots
    # Each job sleeps 1 s in its epoch (warm jobs otherwise end within a second), so that jobs
    # run side by side and in turn on the two slots while the others are posted and cancelled.
    spec = {"dataset": "synthetic", "synthetic_samples": 64, "epochs": 1, "nproc_per_node": 1,
            "labels": hooks(epoch_sleep_s=1.0)}
    with server.client() as c:  # the module's earlier jobs are finished: its newest
        earlier = c.get("/jobs", params={"limit": 1}).json()["items"]
    newest_before = earlier[0]["id"] if earlier else 0

    def post(i: int) -> httpx.Response:
        with server.client() as c:
            return c.post("/jobs", json={**spec, "name": f"burst-{i}"})

    with ThreadPoolExecutor(max_workers=25) as pool:
        responses = list(pool.map(post, range(50)))
    assert [r.status_code for r in responses] == [201] * 50, [r.text for r in responses[:3]]
    ids = sorted(r.json()["id"] for r in responses)
    assert len(set(ids)) == 50
    keep = set(ids[:5])
    with server.client() as c:
        listed = [j["id"] for j in c.get("/jobs?limit=100").json()["items"]]
        assert sorted(i for i in listed if i > newest_before) == ids
        for job_id in ids[5:]:
            c.post(f"/jobs/{job_id}/cancel")
        deadline = time.monotonic() + 180
        while True:
            resources = c.get("/resources").json()
            assert resources["cpu"]["allocated"] <= 2
            states = {j: c.get(f"/jobs/{j}").json()["state"] for j in keep}
            if all(s in ("succeeded", "failed", "cancelled") for s in states.values()):
                break
            assert time.monotonic() < deadline, states
            time.sleep(0.1)
        finals = [c.get(f"/jobs/{j}").json() for j in ids]
    assert all(j["state"] == "succeeded" for j in finals if j["id"] in keep), finals[:5]
    assert {j["state"] for j in finals if j["id"] not in keep} <= {"cancelled", "succeeded"}
    assert keep <= {j["id"] for j in finals if j["started_at"]}
    assert_no_slot_held_twice(finals)
    assert "database is locked" not in server.log.read_text()  # the module's server's whole log


# SQLite only: allocation rows on PostgreSQL are covered by test_supervisor_frees_resources.py
# (both stores); the restart on PostgreSQL:
# tests/run/test_fault.py::test_server_sigkill_and_restart_keeps_job_and_every_record.
def test_restart_keeps_running_jobs_allocations(live_server_factory) -> None:  # type: ignore[no-untyped-def]
    env = {"TORCHYARD_CPU_SLOTS": "2", "TORCHYARD_TEST_EPOCH_SLEEP_S": "1"}
    server: LiveServer = live_server_factory(**env)
    long = {"dataset": "synthetic", "synthetic_samples": 64, "epochs": 1000, "nproc_per_node": 2}
    with server.client() as c:
        a = c.post("/jobs", json=long).json()["id"]
    server.wait_for(a, {"running"})
    server.proc.send_signal(signal.SIGKILL)
    server.proc.wait()

    again: LiveServer = live_server_factory(server.home, server.port, **env)
    with again.client() as c:
        held = {r["name"]: r["job_id"] for r in c.get("/resources").json()["items"]}
        assert held == {"cpu:0": a, "cpu:1": a}
        b = c.post("/jobs", json={**ONE_SLOT, "epochs": 1}).json()["id"]
        # A scheduling pass weighed b against the slots the restart kept for a, and kept it
        # waiting (a pass that lost a's allocation would have launched it instead).
        deadline = time.monotonic() + 30
        while (job_b := c.get(f"/jobs/{b}").json())["waiting_reason"] is None:
            assert job_b["state"] == "queued", job_b
            assert time.monotonic() < deadline, job_b
            time.sleep(0.1)
        assert job_b["state"] == "queued" and job_b["waiting_reason"] == "needs 1 CPU slot; 0 free"
        assert c.get(f"/jobs/{a}").json()["state"] == "running"
        c.post(f"/jobs/{a}/cancel")
    again.wait_for(b, {"succeeded"}, timeout_s=120)
    with again.client() as c:
        assert c.get("/resources").json()["cpu"]["allocated"] == 0


# SQLite: the snapshot's store side is tests/scheduling/test_queue_snapshot.py, on both stores.
def test_every_worker_process_answers_the_same_queue_positions(live_server_factory) -> None:  # type: ignore[no-untyped-def]
    """With ``--workers 2`` only one process supervises; a request that lands on the other is
    answered from the snapshot the supervisor published (service.domain.queue.snapshot), not null."""
    server: LiveServer = live_server_factory(
        _args=("--workers", "2"), TORCHYARD_CPU_SLOTS="1", TORCHYARD_TEST_EPOCH_SLEEP_S="1",
    )
    with server.client() as c:
        blocker = c.post("/jobs", json={**ONE_SLOT, "epochs": 1000}).json()["id"]
    server.wait_for(blocker, {"running"})
    with server.client() as c:
        first, second = (c.post("/jobs", json={**ONE_SLOT, "name": f"q{i}"}).json()["id"]
                         for i in range(2))
    expected = {
        first: (1, "needs 1 CPU slot; 0 free"),
        second: (2, f"needs 1 CPU slot; 0 free, behind job {first}"),
    }

    def place(job: dict) -> tuple[int | None, str | None]:
        assert job["state"] == "queued", job
        return job["queue_position"], job["waiting_reason"]

    # Until the standby answers them too: the supervisor published its pass (within
    # PUBLISH_MIN_S and a tick) and the standby re-read the snapshot (within MAX_AGE_S).
    deadline = time.monotonic() + 30
    while True:
        with server.client() as c:  # a new connection each time: either worker takes it
            if c.get("/healthz").json()["role"] == "standby" and all(
                    place(c.get(f"/jobs/{job_id}").json()) == want
                    for job_id, want in expected.items()):
                break
        assert time.monotonic() < deadline, "the standby never answered the queue's places"
        time.sleep(0.1)

    roles: list[str] = []
    for _ in range(40):
        # A new connection each time: the kernel hands it to either worker's socket.
        with server.client() as c:
            roles.append(c.get("/healthz").json()["role"])
            for job_id, want in expected.items():
                assert place(c.get(f"/jobs/{job_id}").json()) == want, (roles[-1], job_id)
            page = c.get("/jobs", params={"state": "queued", "limit": 50}).json()["items"]
            assert {j["id"]: place(j) for j in page} == expected, roles[-1]
    assert set(roles) == {"supervisor", "standby"}, roles  # both processes were asked
    with server.client() as c:
        for job_id in (blocker, first, second):
            c.post(f"/jobs/{job_id}/cancel")
        cancelled = c.get(f"/jobs/{first}").json()
    assert cancelled["queue_position"] is None and cancelled["waiting_reason"] is None
