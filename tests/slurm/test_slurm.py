"""The Slurm executor against a real Slurm 22.05, all through the API: ``munged``,
``slurmctld`` and two ``slurmd`` emulating nodes ``n1`` and ``n2`` on this host
(``tests/slurmcluster.py``), one cluster for the whole session (the ``slurm`` fixture of
``tests/conftest.py``).

Skipped with a reason where slurm-wlm or munge is not installed, except under ``CI=true``, where
a missing package fails the run instead of silently skipping these tests.
"""

import os
import shutil
import signal
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from tests.conftest import (
    REPO_ROOT,
    LiveServer,
    add_script,
    assert_each_record_once,
    every_record,
    hooks,
    slurm_state,
)
from tests.slurmcluster import NODES, SlurmCluster
from tests.worker.tinymnist import write_tiny_mnist
from torchyard_contract.rundir import RunDir

API_TOKEN = "slurm-tests-api-token-0123456789"


def _wait_records(server: LiveServer, job_id: int, pred, timeout_s: float = 90) -> list[dict]:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not pred(items := every_record(server, job_id)):
        assert time.monotonic() < deadline, "records did not arrive"
        time.sleep(0.3)
    return items


def _job_processes(server: LiveServer, job_id: int) -> list[psutil.Process]:
    """Every process of the job on any node (the nodes are emulated on this host), told apart
    from other servers' jobs with the same id by the job's run directory."""
    run_dir = str((server.home / "runs" / str(job_id)).resolve())
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.environ().get("TORCHYARD_RUN_DIR") == run_dir:
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


def _rank_process(server: LiveServer, job_id: int, rank: int) -> psutil.Process:
    for proc in _job_processes(server, job_id):
        try:
            env = proc.environ()
            if env.get("RANK") == str(rank) and "torch.distributed.run" not in proc.cmdline():
                return proc
        except psutil.Error:
            continue
    raise AssertionError(f"no process of rank {rank} of job {job_id}")


def _assert_no_process_left(server: LiveServer, job_id: int, timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while alive := [p for p in _job_processes(server, job_id) if _alive(p)]:
        assert time.monotonic() < deadline, f"left running: {[p.cmdline() for p in alive]}"
        time.sleep(0.2)


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def test_cluster_runs_a_batch_job_across_both_nodes(slurm: SlurmCluster, tmp_path: Path) -> None:
    out = tmp_path / "out.txt"
    job = slurm.run(
        "sbatch", "--parsable", "--nodes=2", f"--output={out}", "--wait",
        "--wrap", "srun sh -c 'echo $SLURM_NODEID $SLURMD_NODENAME'",
    ).stdout.strip()
    assert job.isdigit()
    assert sorted(out.read_text().split("\n")[:2]) == [f"{i} {n}" for i, n in enumerate(NODES)]


def test_two_node_builtin_job_reports_every_rank_from_both_nodes(
    slurm: SlurmCluster, server: LiveServer
) -> None:
    with server.client() as c:
        resources = c.get("/resources").json()
        assert resources["executor"] == "slurm"
        assert [(n["name"], n["state"]) for n in resources["nodes"]] == [
            ("n1", "idle"), ("n2", "idle")]
        job_id = c.post("/jobs", json={"nnodes": 2, "nproc_per_node": 1, "epochs": 3,
                                       "dataset": "synthetic", "device": "cpu"}).json()["id"]
    job = server.wait_for(job_id, {"succeeded"}, timeout_s=120)
    assert job["attempts"][0]["rank_exit_codes"] == {"0": 0, "1": 0}
    items = every_record(server, job_id)
    assert_each_record_once(items)
    assert {(i["rank"], i["epoch"]) for i in items if i["name"] == "loss"} == {
        (r, e) for r in (0, 1) for e in (1, 2, 3)}
    with server.client() as c:
        summary = c.get(f"/jobs/{job_id}/metrics/summary").json()
        logs = {r: c.get(f"/jobs/{job_id}/logs", params={"rank": r}).json() for r in (0, 1)}
        assert c.get(f"/jobs/{job_id}/logs", params={"rank": 2}).status_code == 404
    assert [(e["count"], sorted(e["ranks"])) for e in summary["items"]] == [(2, ["0", "1"])] * 3
    assert {r: log["node"] for r, log in logs.items()} == {0: "n1", 1: "n2"}  # rank 0: batch host
    assert all(log["complete"] and log["text"] for log in logs.values())
    assert slurm_state(slurm, server, job_id) in ("COMPLETED", None)
    script = (server.home / "runs" / str(job_id) / "job.sbatch").read_text()
    assert "#SBATCH --nodes=2" in script and "TOKEN" not in script


def test_two_node_script_job_mnist_example(
    slurm_server: Callable[..., LiveServer], tmp_path: Path
) -> None:
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    shutil.copy(REPO_ROOT / "examples" / "mnist_ddp.py", scripts / "mnist_ddp.py")
    data = tmp_path / "data"
    write_tiny_mnist(data, train=64, test=32)
    server = slurm_server(TORCHYARD_SCRIPT_DIRS=str(scripts), TORCHYARD_API_TOKENS=API_TOKEN)
    with server.client() as c:
        job_id = c.post("/jobs", json={
            "entrypoint": "mnist_ddp.py", "nnodes": 2, "nproc_per_node": 1,
            "args": ["--data-root", str(data), "--batch-size", "16", "--epochs", "2"],
        }).json()["id"]
    server.wait_for(job_id, {"succeeded"}, timeout_s=180)
    items = every_record(server, job_id)
    assert_each_record_once(items)
    losses = {(i["rank"], i["epoch"]) for i in items if i["name"] == "loss"}
    assert losses == {(r, e) for r in (0, 1) for e in (1, 2)}


@pytest.mark.slow
def test_sigkill_rank_on_second_node_restarts_from_checkpoint(server: LiveServer) -> None:
    spec = {"nnodes": 2, "dataset": "synthetic", "epochs": 6, "max_restarts": 1,
            "device": "cpu", "labels": hooks(epoch_sleep_s=0.7)}
    with server.client() as c:
        job_id = c.post("/jobs", json=spec).json()["id"]
    server.wait_for(job_id, {"running"}, timeout_s=60)
    _wait_records(server, job_id, lambda rs: sum(r["name"] == "loss" for r in rs) >= 4)
    victim = _rank_process(server, job_id, 1)
    assert victim.environ()["SLURMD_NODENAME"] == "n2"
    victim.send_signal(signal.SIGKILL)

    job = server.wait_for(job_id, {"succeeded"}, timeout_s=120)
    assert [a["number"] for a in job["attempts"]] == [1, 2]
    assert job["attempts"][0]["exit_code"] != 0 and job["attempts"][1]["exit_code"] == 0
    assert job["attempts"][0]["rank_exit_codes"]["1"] == -signal.SIGKILL
    items = every_record(server, job_id)
    assert_each_record_once(items)
    resumed = {i["rank"]: i["value"] for i in items
               if i["attempt"] == 2 and i["name"] == "resumed_from_epoch"}
    assert set(resumed) == {0, 1} and resumed[0] == resumed[1] >= 2, resumed
    start = int(resumed[0])
    final = {(i["rank"], i["epoch"]) for i in items if i["attempt"] == 2 and i["name"] == "loss"}
    assert final == {(r, e) for r in (0, 1) for e in range(start + 1, 7)}


@pytest.mark.slow
def test_cancel_leaves_no_process_on_any_node(
    slurm: SlurmCluster, slurm_server: Callable[..., LiveServer]
) -> None:
    server = slurm_server(TORCHYARD_TEST_EPOCH_SLEEP_S="120", TORCHYARD_API_TOKENS=API_TOKEN,
                          AWS_SECRET_ACCESS_KEY="the-servers-own-secret")
    with server.client() as c:
        job_id = c.post("/jobs", json={"nnodes": 2, "dataset": "synthetic", "epochs": 3,
                                       "device": "cpu"}).json()["id"]
        server.wait_for(job_id, {"running"}, timeout_s=60)
        procs = _job_processes(server, job_id)
        assert {p.environ().get("SLURMD_NODENAME") for p in procs} >= {"n1", "n2"}
        # The server's secrets never reach the job; its token only through the environment.
        token = _rank_process(server, job_id, 1).environ()["TORCHYARD_JOB_TOKEN"]
        for proc in procs:
            env = proc.environ()
            assert "TORCHYARD_API_TOKENS" not in env and "AWS_SECRET_ACCESS_KEY" not in env
            assert token not in " ".join(proc.cmdline())
        run_dir = server.home / "runs" / str(job_id)
        assert not any(token in p.read_text(errors="replace")
                       for p in run_dir.rglob("*") if p.is_file() and p.suffix != ".pt")
        assert c.post(f"/jobs/{job_id}/cancel").json()["state"] == "cancelled"
    job = server.wait_for(job_id, {"cancelled"}, allowed=set())
    assert job["reason"] == "cancelled by user"
    _assert_no_process_left(server, job_id)
    deadline = time.monotonic() + 20
    while slurm_state(slurm, server, job_id) not in ("CANCELLED", None):
        assert time.monotonic() < deadline, slurm_state(slurm, server, job_id)
        time.sleep(0.2)


@pytest.mark.slow
def test_server_sigkill_and_restart_readopts_by_slurm_job_id(
    slurm_server: Callable[..., LiveServer],
) -> None:
    server = slurm_server(TORCHYARD_TEST_EPOCH_SLEEP_S="0.5")
    with server.client() as c:
        # Re-adoption is by Slurm job id, whatever the nodes: one node with both ranks (the one
        # Slurm test of two ranks on a node; the others use one, each cold rank ~4 CPU s).
        job_id = c.post("/jobs", json={"nnodes": 1, "nproc_per_node": 2, "dataset": "synthetic",
                                       "epochs": 8, "device": "cpu"}).json()["id"]
    server.wait_for(job_id, {"running"}, timeout_s=60)
    _wait_records(server, job_id, lambda rs: any(r["name"] == "loss" for r in rs))
    os.killpg(server.proc.pid, signal.SIGKILL)
    server.proc.wait()
    # It trains on without the server: a rank's spool (each record, before it is sent) grows.
    spool = RunDir.for_job(server.home / "runs", job_id).spool_file(0)
    size, deadline = spool.stat().st_size, time.monotonic() + 60
    while spool.stat().st_size == size:
        assert time.monotonic() < deadline, "the job made no progress once the server was gone"
        time.sleep(0.1)
    assert _job_processes(server, job_id), "the job died with the server"

    again = slurm_server(server.home, server.port, TORCHYARD_TEST_EPOCH_SLEEP_S="0.5")
    job = again.wait_for(job_id, {"succeeded"}, timeout_s=120)
    assert job["exit_code"] == 0 and [a["number"] for a in job["attempts"]] == [1]
    items = every_record(again, job_id)
    assert_each_record_once(items)
    losses = {(i["rank"], i["epoch"]) for i in items if i["name"] == "loss"}
    assert losses == {(r, e) for r in (0, 1) for e in range(1, 9)}
    assert "re-adopted (slurm" in again.log.read_text()


def test_pending_job_shows_slurms_reason_then_runs(
    slurm: SlurmCluster, server: LiveServer
) -> None:
    blocker = slurm.run("sbatch", "--parsable", "--nodes=2", "--exclusive", "--output=/dev/null",
                        "--wrap", "sleep 300").stdout.strip()
    try:
        with server.client() as c:
            # The blocker holds both nodes: a one-node job waits as a two-node one would.
            job_id = c.post("/jobs", json={"nnodes": 1, "dataset": "synthetic", "epochs": 1,
                                           "device": "cpu"}).json()["id"]
            deadline = time.monotonic() + 30
            while not (job := c.get(f"/jobs/{job_id}").json())["waiting_reason"]:
                assert job["state"] == "queued", job
                assert time.monotonic() < deadline, job
                time.sleep(0.2)
        assert job["state"] == "queued"
        assert job["waiting_reason"] in ("Slurm: Resources", "Slurm: Priority"), job
        assert job["queue_position"] == 1
    finally:
        slurm.run("scancel", blocker)
    server.wait_for(job_id, {"succeeded"}, timeout_s=90)


@pytest.mark.slow
def test_job_slurm_purged_while_the_server_was_down_still_ends_right(
    slurm: SlurmCluster, slurm_server: Callable[..., LiveServer]
) -> None:
    server = slurm_server()
    with server.client() as c:
        # One rank: what is tested is the end Slurm no longer knows, not the ranks.
        job_id = c.post("/jobs", json={"nnodes": 1, "nproc_per_node": 1, "dataset": "synthetic",
                                       "epochs": 2, "device": "cpu"}).json()["id"]
    server.wait_for(job_id, {"starting", "running"}, timeout_s=60)
    os.killpg(server.proc.pid, signal.SIGKILL)
    server.proc.wait()
    # MinJobAge=2: Slurm forgets the finished job within seconds (no accounting database).
    deadline = time.monotonic() + 120
    while slurm_state(slurm, server, job_id) is not None or _job_processes(server, job_id):
        assert time.monotonic() < deadline, slurm_state(slurm, server, job_id)
        time.sleep(0.5)

    again = slurm_server(server.home, server.port)
    job = again.wait_for(job_id, {"succeeded"}, timeout_s=60)
    assert job["exit_code"] == 0 and job["attempts"][0]["rank_exit_codes"] == {"0": 0}
    items = every_record(again, job_id)
    assert_each_record_once(items)
    assert {(i["rank"], i["epoch"]) for i in items if i["name"] == "loss"} == {(0, 1), (0, 2)}


def test_a_job_slurm_refuses_fails_with_sbatchs_reason(server: LiveServer) -> None:
    with server.client() as c:
        job_id = c.post("/jobs", json={"partition": "nosuch", "epochs": 1}).json()["id"]
    job = server.wait_for(job_id, {"failed"}, timeout_s=30, allowed={"queued"})
    assert job["reason"].startswith("could not submit: sbatch exited 1"), job["reason"]
    assert "partition" in job["reason"].lower(), job["reason"]


def test_a_failing_rank_fails_the_job_and_slurms_own_record(
    slurm: SlurmCluster, server: LiveServer
) -> None:
    with server.client() as c:
        job_id = c.post("/jobs", json={"nnodes": 2, "dataset": "synthetic", "epochs": 2,
                                       "device": "cpu", "labels": hooks(fail_rank=1)}).json()["id"]
    job = server.wait_for(job_id, {"failed"}, timeout_s=90)
    # Rank 1 is node 1's local rank 0: named by its global rank (service.run.exitreason).
    assert job["reason"].startswith("rank 1 failed: RuntimeError: test hook: rank 1 failed"), \
        job["reason"]
    assert job["exit_code"] not in (None, 0)
    # The batch script exec's the attempt loop, which exits with the attempt's code: Slurm's
    # record says FAILED too (a script ending in srun would say COMPLETED 0:0).
    # (Checked at once: MinJobAge=2 leaves the finished job listed for a few seconds.)
    deadline = time.monotonic() + 10
    while (state := slurm_state(slurm, server, job_id)) in ("RUNNING", "COMPLETING"):
        assert time.monotonic() < deadline, state
        time.sleep(0.1)
    assert state == "FAILED"


def _pause_losses(server: LiveServer, job_id: int) -> Counter:
    return Counter((i["rank"], i["epoch"]) for i in every_record(server, job_id)
                   if i["name"] == "loss")


def test_pause_releases_the_allocation_and_resume_goes_on(
    slurm: SlurmCluster, server: LiveServer
) -> None:
    """Pause and resume (issue 25, item 1, docs/lifecycle.md): a pause releases the job's
    allocation and a resume asks Slurm for a new one. One rank: every rank pausing at one
    epoch boundary is tests/lifecycle/test_pause.py's (each cold rank here costs ~4 CPU s; two
    ranks on a Slurm node: test_server_sigkill_and_restart_readopts_by_slurm_job_id)."""
    spec = {"nnodes": 1, "nproc_per_node": 1, "dataset": "synthetic", "epochs": 6,
            "device": "cpu", "labels": hooks(epoch_sleep_s=0.5)}
    with server.client() as c:
        job_id = c.post("/jobs", json=spec).json()["id"]
        server.wait_for(job_id, {"running"}, timeout_s=60)
        deadline = time.monotonic() + 90
        while sum(_pause_losses(server, job_id).values()) < 2:
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
    seen = _pause_losses(server, job_id)
    assert set(seen) == {(0, e) for e in range(1, 7)} and max(seen.values()) == 1


def test_a_job_paused_while_pending_in_slurm_is_withdrawn(
    slurm: SlurmCluster, server: LiveServer
) -> None:
    """Paused while pending in Slurm's queue: withdrawn from it, submitted again on resume."""
    blocker = slurm.run("sbatch", "--parsable", "--nodes=2", "--exclusive", "--output=/dev/null",
                        "--wrap", "sleep 300").stdout.strip()
    try:
        with server.client() as c:
            # The blocker holds both nodes: a one-node job waits as a two-node one would.
            job_id = c.post("/jobs", json={"nnodes": 1, "dataset": "synthetic", "epochs": 1,
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


# Exits 3 in its first attempt (every attempt with "always"); later ones print what Slurm's own
# record of their batch job says it excludes (scontrol, from inside the allocation).
ELSEWHERE = """
import os, subprocess, sys
import worker
worker.ready()
attempt = int(os.environ["TORCHYARD_ATTEMPT"])
print(f"attempt {attempt} on {os.environ['SLURMD_NODENAME']}", flush=True)
if attempt == 1 or sys.argv[1:] == ["always"]:
    sys.exit(3)
record = subprocess.run(["scontrol", "show", "job", os.environ["SLURM_JOB_ID"]],
                        capture_output=True, text=True, check=True).stdout
print(*(w for w in record.split() if w.startswith("ExcNodeList=")), flush=True)
"""


def test_retry_elsewhere_runs_the_next_attempt_without_the_failing_node(
    server: LiveServer,
) -> None:
    """retry_elsewhere (docs/lifecycle.md, "Retry rules"): the attempt loop ends the allocation,
    the job is queued again and submitted with --exclude of the failing rank's node; a job that
    fails on every node fails at submit, saying which nodes it excludes."""
    add_script(server, "elsewhere.py", ELSEWHERE)
    spec = {"entrypoint": "elsewhere.py", "nproc_per_node": 1, "device": "cpu",
            "heartbeat_timeout_s": None,
            "on_failure": [{"exit_codes": [3], "action": "retry_elsewhere"}]}
    with server.client() as c:
        once = c.post("/jobs", json={**spec, "max_restarts": 1}).json()["id"]
        always = c.post("/jobs", json={**spec, "args": ["always"], "max_restarts": 2}).json()["id"]
    job = server.wait_for(once, {"succeeded"}, timeout_s=120)
    assert [a["number"] for a in job["attempts"]] == [1, 2]
    with server.client() as c:
        first, second = (c.get(f"/jobs/{once}/logs", params={"rank": 0, "attempt": n}).json()
                         for n in (1, 2))
    failed_on = first["node"]
    assert failed_on in NODES and second["node"] in NODES and second["node"] != failed_on
    decision = job["attempts"][0]["decision"]
    assert decision["action"] == "retry_elsewhere" and decision["excluded_node"] == failed_on
    assert decision["summary"] == (
        f"restarted elsewhere: rank 0 exited with code 3 (rule 1); excluding node {failed_on}")
    assert job["attempts"][1]["decision"] is None
    assert job["exclude_nodes"] == [failed_on]
    # Slurm's record of the second batch job excludes the node (and the script asked for it).
    assert f"ExcNodeList={failed_on}" in second["text"], second["text"]
    script = (server.home / "runs" / str(once) / "job.sbatch").read_text()
    assert f"#SBATCH --exclude={failed_on}" in script.splitlines()

    job = server.wait_for(always, {"failed"}, timeout_s=120)
    nodes = [a["decision"]["excluded_node"] for a in job["attempts"]]
    assert sorted(nodes) == sorted(NODES) and job["exclude_nodes"] == nodes, job
    assert job["reason"].startswith("could not submit: sbatch exited 1"), job["reason"]
    assert f"the job excludes node(s) {','.join(nodes)}" in job["reason"], job["reason"]
