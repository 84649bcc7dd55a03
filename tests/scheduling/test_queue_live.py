"""The queue against a real server and real torchrun groups: side by side, no double booking,
allocations kept across a server restart."""

import signal
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime

import httpx

from tests.conftest import LiveServer, both_stores

ONE_SLOT = {"dataset": "synthetic", "synthetic_samples": 64, "epochs": 2, "nproc_per_node": 1}


def _t(value: str) -> datetime:
    return datetime.fromisoformat(value)


def test_two_slots_run_two_jobs_side_by_side_and_the_third_after(live_server_factory) -> None:  # type: ignore[no-untyped-def]
    server: LiveServer = live_server_factory(
        TORCHYARD_CPU_SLOTS="2", TORCHYARD_TEST_EPOCH_SLEEP_S="1.5"
    )
    with server.client() as c:
        ids = [c.post("/jobs", json={**ONE_SLOT, "name": f"j{i}"}).json()["id"] for i in range(3)]
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
# PostgreSQL half: test_store, test_queue_snapshot; two writing processes: test_workers).
def test_fifty_concurrent_posts_are_all_stored_and_never_share_a_slot(live_server_factory) -> None:  # type: ignore[no-untyped-def]
    server: LiveServer = live_server_factory(TORCHYARD_CPU_SLOTS="2")
    spec = {"dataset": "synthetic", "synthetic_samples": 64, "epochs": 1, "nproc_per_node": 1}

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
        assert len(c.get("/jobs?limit=100").json()["items"]) == 50
        for job_id in ids[5:]:
            c.post(f"/jobs/{job_id}/cancel")
        deadline = time.monotonic() + 180
        samples = 0
        while True:
            # Keyed by id: a job moving starting → running between the two reads shows twice.
            active = {j["id"]: j["devices"] for state in ("starting", "running")
                      for j in c.get(f"/jobs?state={state}&limit=100").json()["items"]}
            held = [d for devices in active.values() for d in devices]
            assert len(held) == len(set(held)), f"a slot is held twice: {active}"
            resources = c.get("/resources").json()
            assert resources["cpu"]["allocated"] <= 2
            samples += 1
            states = {j: c.get(f"/jobs/{j}").json()["state"] for j in keep}
            if all(s in ("succeeded", "failed", "cancelled") for s in states.values()):
                break
            assert time.monotonic() < deadline, states
            time.sleep(0.1)
        finals = [c.get(f"/jobs/{j}").json() for j in ids]
    assert samples > 5
    assert all(j["state"] == "succeeded" for j in finals if j["id"] in keep), finals[:5]
    assert {j["state"] for j in finals if j["id"] not in keep} <= {"cancelled", "succeeded"}
    assert "database is locked" not in server.log.read_text()


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
        time.sleep(1.5)  # several scheduling passes
        job_b = c.get(f"/jobs/{b}").json()
        assert job_b["state"] == "queued" and job_b["waiting_reason"] == "needs 1 CPU slot; 0 free"
        assert c.get(f"/jobs/{a}").json()["state"] == "running"
        c.post(f"/jobs/{a}/cancel")
    again.wait_for(b, {"succeeded"}, timeout_s=120)
    with again.client() as c:
        assert c.get("/resources").json()["cpu"]["allocated"] == 0


@both_stores
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

    deadline = time.monotonic() + 30
    with server.client() as c:
        while place(c.get(f"/jobs/{second}").json()) != expected[second]:
            assert time.monotonic() < deadline, c.get(f"/jobs/{second}").json()
            time.sleep(0.1)
    # Published within PUBLISH_MIN_S and a tick; every other process re-reads within MAX_AGE_S.
    time.sleep(2.0)

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
