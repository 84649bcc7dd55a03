"""On Slurm, a job cancelled while Slurm still holds it pending ends ``cancelled`` (issue 25,
item 5), on the real test cluster (``tests/slurmcluster.py``)."""

import time

from tests.conftest import LiveServer
from tests.slurmcluster import SlurmCluster


def test_a_job_cancelled_while_pending_in_slurm_ends_cancelled(
    slurm: SlurmCluster, server: LiveServer
) -> None:
    blocker = slurm.run("sbatch", "--parsable", "--nodes=2", "--exclusive", "--output=/dev/null",
                        "--wrap", "sleep 300").stdout.strip()
    try:
        with server.client() as c:
            job_id = c.post("/jobs", json={"nnodes": 2, "dataset": "synthetic", "epochs": 1,
                                           "device": "cpu"}).json()["id"]
            deadline = time.monotonic() + 30
            while not (job := c.get(f"/jobs/{job_id}").json())["waiting_reason"]:
                assert job["state"] == "queued", job
                assert time.monotonic() < deadline, job
                time.sleep(0.2)
            reference = c.get(f"/jobs/{job_id}").json()
            assert c.post(f"/jobs/{job_id}/cancel").json()["state"] == "cancelled"
            # Slurm ends the pending job; the supervisor reaps it and finishes it at once: a job
            # that never ran has no outcome file to wait for (``outcome_visible_within_s``, 30 s).
            deadline = time.monotonic() + 15
            while f"job {job_id}: finished" not in server.log.read_text():
                assert time.monotonic() < deadline, server.log.read_text()[-3000:]
                time.sleep(0.3)
            job = c.get(f"/jobs/{job_id}").json()
        assert job["state"] == "cancelled", job
        assert job["reason"] == "cancelled by user", job
        assert reference["state"] == "queued"
    finally:
        slurm.run("scancel", blocker)


def test_a_job_scancelled_while_pending_ends_cancelled(
    slurm: SlurmCluster, server: LiveServer
) -> None:
    """Cancelled in Slurm itself (an operator's ``scancel``) before it ever ran: no outcome file
    exists, and the job still ends ``cancelled``, saying so, not ``failed``."""
    blocker = slurm.run("sbatch", "--parsable", "--nodes=2", "--exclusive", "--output=/dev/null",
                        "--wrap", "sleep 300").stdout.strip()
    try:
        with server.client() as c:
            job_id = c.post("/jobs", json={"nnodes": 2, "dataset": "synthetic", "epochs": 1,
                                           "device": "cpu"}).json()["id"]
            deadline = time.monotonic() + 30
            while not (job := c.get(f"/jobs/{job_id}").json())["waiting_reason"]:
                assert job["state"] == "queued", job
                assert time.monotonic() < deadline, job
                time.sleep(0.2)
        pending = slurm.run("squeue", "-h", "-o", "%i").stdout.split()
        ours = [ref for ref in pending if ref != blocker]
        assert len(ours) == 1, pending
        slurm.run("scancel", ours[0])
        # Never ran: no wait for an outcome file (``outcome_visible_within_s``, 30 s).
        job = server.wait_for(job_id, {"cancelled"}, timeout_s=15, allowed={"queued", "starting"})
        assert "Slurm" in job["reason"] and "CANCELLED" in job["reason"], job
    finally:
        slurm.run("scancel", blocker)
