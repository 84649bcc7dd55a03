"""Pause and resume on the real Slurm test cluster (issue 25, item 1): a pause releases the job's
allocation and a resume asks Slurm for a new one; a job paused while pending in Slurm's queue is
withdrawn from it (``tests/conftest.py``'s ``slurm`` fixture; docs/lifecycle.md)."""

import time
from collections import Counter
from collections.abc import Callable

from tests.conftest import LiveServer, every_record, slurm_state
from tests.slurmcluster import SlurmCluster


def _losses(server: LiveServer, job_id: int) -> Counter:
    return Counter((i["rank"], i["epoch"]) for i in every_record(server, job_id)
                   if i["name"] == "loss")


def test_pause_releases_the_allocation_and_resume_goes_on(
    slurm: SlurmCluster, slurm_server: Callable[..., LiveServer]
) -> None:
    server = slurm_server(TORCHYARD_TEST_EPOCH_SLEEP_S="0.5")
    spec = {"nnodes": 2, "dataset": "synthetic", "epochs": 6, "device": "cpu"}
    with server.client() as c:
        job_id = c.post("/jobs", json=spec).json()["id"]
        server.wait_for(job_id, {"running"}, timeout_s=60)
        deadline = time.monotonic() + 90
        while sum(_losses(server, job_id).values()) < 4:
            assert time.monotonic() < deadline, "too few epochs reported"
            time.sleep(0.2)
        assert c.post(f"/jobs/{job_id}/pause").json()["state"] == "pausing"
        job = server.wait_for(job_id, {"paused"}, timeout_s=60, allowed={"pausing"})
        assert job["attempts"][-1]["paused"] is True
        deadline = time.monotonic() + 20  # the batch job ended: its allocation is released
        while slurm_state(slurm, server, job_id) in ("RUNNING", "COMPLETING"):
            assert time.monotonic() < deadline
            time.sleep(0.2)
        assert c.post(f"/jobs/{job_id}/resume").json()["state"] == "queued"
    job = server.wait_for(job_id, {"succeeded"}, timeout_s=120)
    assert [a["number"] for a in job["attempts"]] == [1, 2]
    seen = _losses(server, job_id)
    assert set(seen) == {(r, e) for r in (0, 1) for e in range(1, 7)} and max(seen.values()) == 1


def test_a_job_paused_while_pending_in_slurm_is_withdrawn(
    slurm: SlurmCluster, slurm_server: Callable[..., LiveServer]
) -> None:
    server = slurm_server()
    blocker = slurm.run("sbatch", "--parsable", "--nodes=2", "--exclusive", "--output=/dev/null",
                        "--wrap", "sleep 300").stdout.strip()
    try:
        with server.client() as c:
            job_id = c.post("/jobs", json={"nnodes": 2, "dataset": "synthetic", "epochs": 1,
                                           "device": "cpu"}).json()["id"]
            deadline = time.monotonic() + 30
            while slurm_state(slurm, server, job_id) != "PENDING":
                assert time.monotonic() < deadline
                time.sleep(0.2)
            assert c.post(f"/jobs/{job_id}/pause").json()["state"] == "paused"
            deadline = time.monotonic() + 30
            while slurm_state(slurm, server, job_id) == "PENDING":
                assert time.monotonic() < deadline, "still pending in Slurm"
                time.sleep(0.2)
            assert c.get(f"/jobs/{job_id}").json()["state"] == "paused"
            slurm.run("scancel", blocker)
            assert c.post(f"/jobs/{job_id}/resume").json()["state"] == "queued"
    finally:
        slurm.run("scancel", blocker, check=False)
    job = server.wait_for(job_id, {"succeeded"}, timeout_s=90)
    assert [a["number"] for a in job["attempts"]] == [1]
