"""End to end: a real server, real torchrun process groups on CPU with gloo."""

import math
import time

import psutil

from tests.conftest import LiveServer, hooks

DIGITS_2RANK = {"name": "digits-ddp", "model": "mlp", "dataset": "digits", "epochs": 4,
                "batch_size": 64, "lr": 0.05, "nproc_per_node": 2}


def _poll_all(server: LiveServer, job_id: int, timeout_s: float = 180) -> tuple[list[dict], str]:
    """Follow ``?after=`` until the job is terminal and a page comes back empty."""
    items: list[dict] = []
    after = 0
    deadline = time.monotonic() + timeout_s
    with server.client() as c:
        while time.monotonic() < deadline:
            page = c.get(f"/jobs/{job_id}/metrics", params={"after": after, "limit": 7}).json()
            items += page["items"]
            after = page["next_after"]
            assert page["state"] not in ("failed", "cancelled"), c.get(f"/jobs/{job_id}").json()
            if page["state"] == "succeeded" and not page["items"]:
                return items, page["state"]
            if not page["items"]:
                time.sleep(0.2)
    raise AssertionError(f"job {job_id} did not finish in {timeout_s} s")


def test_two_rank_digits_job_reports_every_epoch_from_every_rank(
    shared_server: LiveServer,
) -> None:
    live_server = shared_server
    with live_server.client() as c:
        r = c.post("/jobs", json=DIGITS_2RANK)
        assert r.status_code == 201
        job_id = r.json()["id"]
    items, state = _poll_all(live_server, job_id)
    assert state == "succeeded"
    seqs = [i["seq"] for i in items]
    assert len(seqs) == len(set(seqs)) and seqs == sorted(seqs), "each record exactly once, in order"
    keys = [(i["attempt"], i["rank"], i["epoch"], i["step"], i["name"]) for i in items]
    assert len(keys) == len(set(keys))
    losses = {(i["rank"], i["epoch"]): i["value"] for i in items if i["name"] == "loss"}
    assert set(losses) == {(r, e) for r in (0, 1) for e in range(1, 5)}
    assert all(isinstance(v, float) and math.isfinite(v) for v in losses.values())
    for rank in (0, 1):
        assert losses[(rank, 4)] < losses[(rank, 1)]
    names = {i["name"] for i in items}
    assert {"loss", "samples", "seconds", "samples_per_s", "test_accuracy"} <= names

    with live_server.client() as c:
        job = c.get(f"/jobs/{job_id}").json()
    assert job["exit_code"] == 0 and job["reason"] is None
    assert job["started_at"] and job["running_at"] and job["ended_at"]
    assert job["devices"] == ["cpu:0", "cpu:1"]


def test_cancel_running_job_leaves_no_process(live_server_factory) -> None:  # type: ignore[no-untyped-def]
    # Cold: the ranks are the attempt loop's descendants (tests/test_warm_jobs.py: the same for warm ranks).
    server = live_server_factory(TORCHYARD_TEST_EPOCH_SLEEP_S="2", TORCHYARD_WARM_RANKS="false")
    spec = {"dataset": "synthetic", "epochs": 1000, "nproc_per_node": 2}
    with server.client() as c:
        job_id = c.post("/jobs", json=spec).json()["id"]
        job = server.wait_for(job_id, {"running"})
        leader = psutil.Process(job["pid"])
        members = [leader, *leader.children(recursive=True)]
        assert len(members) >= 3, "torchrun agent plus two ranks"
        r = c.post(f"/jobs/{job_id}/cancel")
        assert r.status_code == 200 and r.json()["state"] == "cancelled"
        assert c.post(f"/jobs/{job_id}/cancel").json()["state"] == "cancelled"
        deadline = time.monotonic() + 20
        while any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in members):
            assert time.monotonic() < deadline, "processes of the cancelled job survived"
            time.sleep(0.2)
        # Resources come back: every slot is free again (a new job taking them is
        # tests/scheduling/test_supervisor_frees_resources.py's; a cold 4-rank job here cost
        # ~20 CPU-seconds of the suite).
        deadline = time.monotonic() + 20
        while (cpu := c.get("/resources").json()["cpu"])["allocated"] != 0:
            assert time.monotonic() < deadline, cpu
            time.sleep(0.1)
        assert cpu["free"] == cpu["total"] >= 2
        assert c.get(f"/jobs/{job_id}").json()["state"] == "cancelled"


def test_failing_rank_is_named_in_reason(shared_server: LiveServer) -> None:
    server = shared_server
    with server.client() as c:
        job_id = c.post("/jobs", json={"dataset": "synthetic", "epochs": 2, "nproc_per_node": 2,
                                       "labels": hooks(fail_rank=1)}).json()["id"]
    job = server.wait_for(job_id, {"failed"})
    assert job["exit_code"] not in (None, 0)
    assert "rank 1" in job["reason"] and "test hook" in job["reason"], job["reason"]
