"""A team's Slurm account on the real test cluster (Slurm 22.05, no accounting daemon: the
account is taken as given, not checked against slurmdbd — which this test cannot check): a
member's job is submitted with its team's ``--account``, Slurm's own record of the batch job
says so, and the usage account has the job's run (docs/slurm.md, "Accounts and fair share")."""

from tests.conftest import LiveServer, add_script
from tests.security.people import new_token

ACCOUNT = """
import os, subprocess
import worker
worker.ready()
record = subprocess.run(["scontrol", "show", "job", os.environ["SLURM_JOB_ID"]],
                        capture_output=True, text=True, check=True).stdout
print(*(w for w in record.split() if w.startswith(("Account=", "QOS="))), flush=True)
"""


def test_a_members_job_is_charged_to_the_teams_account(server: LiveServer) -> None:
    add_script(server, "account.py", ACCOUNT)
    with server.client() as admin:
        assert admin.post("/teams", json={"name": "charged", "slurm_account": "vision-acct",
                                          "quota": {"max_slots": 1}}).status_code == 201
        assert admin.post("/users", json={"name": "carla", "team": "charged"}).status_code == 201
        token = new_token(admin, "carla")
    with server.client() as carla:
        carla.headers["authorization"] = f"Bearer {token}"
        spec = {"entrypoint": "account.py", "nproc_per_node": 2, "device": "cpu"}
        refused = carla.post("/jobs", json={**spec, "account": "someone-else"})
        assert refused.status_code == 422 and refused.json()["message"].startswith("account:")
        job_id = carla.post("/jobs", json=spec).json()["id"]  # 2 slots: quotas are Slurm's here
    server.wait_for(job_id, {"succeeded"}, timeout_s=120)
    script = (server.home / "runs" / str(job_id) / "job.sbatch").read_text()
    assert "#SBATCH --account=vision-acct" in script.splitlines()
    with server.client() as admin:
        log = admin.get(f"/jobs/{job_id}/logs", params={"rank": 0}).json()["text"]
        rows = admin.get("/usage", params={"group_by": "job"}).json()["items"]
    assert "Account=vision-acct" in log, log
    (row,) = [r for r in rows if r["job_id"] == job_id]
    assert (row["team"], row["user"], row["attempts"]) == ("charged", "carla", 1)
    assert row["slot_seconds"] > 0
