"""The ``torchyard`` client commands, run as real subprocesses against a live server."""

import subprocess
import sys
from pathlib import Path

from service.client.options import EXIT_CANCELLED, EXIT_ERROR, EXIT_FAILED, EXIT_TIMEOUT
from service.client.render import fmt_value
from service.store import repository as repo
from service.store.db import make_engine, make_session_factory
from tests.conftest import REPO_ROOT, LiveServer, cli, hooks
from torchyard_contract.rundir import RunDir
from torchyard_contract.spec import JobSpec
from torchyard_contract.state import JobState


def test_client_commands_never_import_torch() -> None:
    code = "import sys, service.cli; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO_ROOT)


def test_submit_follow_prints_final_losses_and_exits_0(
    shared_server: LiveServer, tmp_path: Path
) -> None:
    live_server = shared_server
    spec_file = tmp_path / "job.yaml"
    spec_file.write_text("name: cli-follow\ndataset: digits\nepochs: 2\nlabels: {team: ml}\n")
    run = cli(live_server, "submit", str(spec_file), "--nproc-per-node", "2", "--set", "lr=0.1",
              "--follow")
    assert run.returncode == 0, run.stdout + run.stderr
    with live_server.client() as c:
        job = c.get("/jobs?name=cli-follow").json()["items"][0]
        losses = c.get(f"/jobs/{job['id']}/metrics", params={"name": "loss"}).json()["items"]
    assert job["state"] == "succeeded"
    assert (job["spec"]["lr"], job["spec"]["nproc_per_node"], job["spec"]["labels"]) == (
        0.1, 2, {"team": "ml"}
    )
    assert "final loss per rank" in run.stdout
    rows = [[c.strip() for c in line.strip("│").split("│")]
            for line in run.stdout.splitlines() if line.startswith("│")]
    for rank in (0, 1):
        value = next(m["value"] for m in losses if m["rank"] == rank and m["epoch"] == 2)
        assert [str(rank), "1", "2", fmt_value(value)] in rows, run.stdout
    assert "ranks diverged" not in run.stdout
    assert f"job {job['id']} succeeded" in run.stdout

    # The other read commands on the finished job.
    listed = cli(live_server, "jobs", "--state", "succeeded")
    assert listed.returncode == 0 and "cli-follow" in listed.stdout and "team=ml" in listed.stdout
    shown = cli(live_server, "show", str(job["id"]))
    assert shown.returncode == 0 and "succeeded" in shown.stdout and "spec.epochs" in shown.stdout
    followed = cli(live_server, "metrics", str(job["id"]), "--name", "loss", "--follow")
    assert followed.returncode == 0
    assert sum("loss" in line for line in followed.stdout.splitlines()) == 4  # 2 ranks x 2 epochs
    log = cli(live_server, "logs", str(job["id"]), "--rank", "1", "--follow")
    path = RunDir.for_job(live_server.home / "runs", job["id"]).logs_dir
    combined = (path / "attempt-1" / "rank-1.log").read_text(errors="replace")
    assert log.returncode == 0 and log.stdout == combined and "rank1 INFO" in combined
    (stderr_file,) = path.glob("attempt-1/*/attempt_*/1/stderr.log")
    only = cli(live_server, "logs", str(job["id"]), "--rank", "1", "--stream", "stderr")
    assert only.returncode == 0 and only.stdout == stderr_file.read_text(errors="replace")


def test_show_lists_the_nodes_a_job_excludes_only_when_it_has_some(
    shared_server: LiveServer,
) -> None:
    """``retry_elsewhere`` on Slurm leaves nodes out of a job's restarts (``exclude_nodes``).
    The two jobs are written into the shared server's database, already ended: nothing runs."""
    engine = make_engine(f"sqlite:///{shared_server.home / 'torchyard.db'}")
    try:
        with make_session_factory(engine)() as session:
            ids = []
            for nodes in (["n1", "n2"], []):
                job = repo.create_job(session, JobSpec.model_validate({"dataset": "synthetic"}))
                job.exclude_nodes = nodes
                assert repo.transition(session, job.id, JobState.failed, reason="rank 0 failed")
                ids.append(job.id)
            session.commit()
    finally:
        engine.dispose()
    excluded, plain = (cli(shared_server, "show", str(job_id)) for job_id in ids)
    assert excluded.returncode == 0 and plain.returncode == 0, excluded.stderr + plain.stderr
    rows = [[c.strip() for c in line.strip("│").split("│")]
            for line in excluded.stdout.splitlines() if line.startswith("│")]
    assert ["exclude_nodes", "n1, n2"] in rows, excluded.stdout
    assert "rank 0 failed" in plain.stdout and "exclude_nodes" not in plain.stdout


def test_wait_exit_codes(shared_server: LiveServer) -> None:
    server = shared_server
    spec = {"name": "doomed", "dataset": "digits", "epochs": 2, "nproc_per_node": 2,
            "labels": hooks(fail_rank=1)}
    with server.client() as c:
        failing = c.post("/jobs", json=spec).json()["id"]
        cancelled = c.post("/jobs", json={**spec, "name": "cancelled",
                                          "labels": hooks(epoch_sleep_s=5)}).json()["id"]

    # Its first epoch ends after 5 s: after 1 s the job cannot have ended.
    early = cli(server, "wait", str(cancelled), "--timeout", "1")
    assert early.returncode == EXIT_TIMEOUT, early.stdout + early.stderr
    assert cli(server, "cancel", str(cancelled)).returncode == 0
    assert cli(server, "wait", str(cancelled)).returncode == EXIT_CANCELLED

    failed = cli(server, "wait", str(failing))
    assert failed.returncode == EXIT_FAILED, failed.stdout + failed.stderr
    assert f"job {failing} failed" in failed.stdout and "rank 1" in failed.stdout

    unknown = cli(server, "wait", "999999")  # the shared server has nowhere near that many
    assert unknown.returncode == EXIT_ERROR and "job 999999 not found" in unknown.stderr
    bad = cli(server, "submit", "--set", "epochs=0")
    assert bad.returncode == EXIT_ERROR and "epochs" in bad.stderr
