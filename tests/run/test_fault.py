"""Fault tolerance with real processes and real signals: dying ranks, a dying server, hangs."""

import json
import signal
import sqlite3
import time

import httpx
import psutil

from tests.conftest import (
    ADOPTS_ONLY,
    LiveServer,
    assert_each_record_once,
    both_stores,
    every_record,
    hooks,
)
from torchyard_contract.rundir import RunDir

# The launch window, held open by the database (see the test that uses them).
WINDOW_TRIGGER = "test_launch_window"
WINDOW = "the test holds this job in its launch window"


def _rank_pids(loop_pid: int) -> dict[int, int]:
    """rank → pid of the trainer (``python -m worker``; not the ``service.run.ranktee`` wrapper in
    front of it), from the attempt loop's descendants' environment."""
    found = {}
    for proc in psutil.Process(loop_pid).children(recursive=True):
        try:
            if proc.cmdline()[1:3] == ["-m", "worker"] and "RANK" in proc.environ():
                found[int(proc.environ()["RANK"])] = proc.pid
        except psutil.Error:
            continue
    return found


def _wait_records(server: LiveServer, job_id: int, pred, timeout_s: float = 90) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not pred(every_record(server, job_id)):
        assert time.monotonic() < deadline, "records did not arrive"
        time.sleep(0.3)


def _await_progress_without_the_server(run: RunDir, timeout_s: float = 60) -> None:
    """Until a rank's spool (every record it reports, written before it is sent) grows after
    the server died: the job trains on without it."""
    size = run.spool_file(0).stat().st_size
    deadline = time.monotonic() + timeout_s
    while run.spool_file(0).stat().st_size == size:
        assert time.monotonic() < deadline, "the job made no progress once the server was gone"
        time.sleep(0.1)


def _assert_gone(pids: list[int]) -> None:
    deadline = time.monotonic() + 15
    for pid in pids:
        while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline, f"pid {pid} survived"
            time.sleep(0.1)


# A SIGKILLed rank and the resume from its checkpoint: warm ranks in
# tests/warm/test_warm_jobs.py::test_sigkill_of_a_warm_rank_restarts_from_checkpoint, cold ones
# on two Slurm nodes in tests/slurm/test_slurm.py (a cold group here cost ~20 CPU s).


@both_stores
def test_server_sigkill_and_restart_keeps_job_and_every_record(live_server_factory) -> None:  # type: ignore[no-untyped-def]
    server = live_server_factory(TORCHYARD_TEST_EPOCH_SLEEP_S="0.5")
    with server.client() as c:
        job_id = c.post("/jobs", json={"dataset": "synthetic", "epochs": 8,
                                       "nproc_per_node": 2}).json()["id"]
    job = server.wait_for(job_id, {"running"})
    _wait_records(server, job_id, lambda rs: any(r["name"] == "loss" for r in rs))
    server.proc.send_signal(signal.SIGKILL)
    server.proc.wait()
    _await_progress_without_the_server(RunDir.for_job(server.home / "runs", job_id))
    assert psutil.pid_exists(job["pid"]), "the job died with the server"

    again = live_server_factory(server.home, server.port, TORCHYARD_TEST_EPOCH_SLEEP_S="0.5",
                                **ADOPTS_ONLY)
    job = again.wait_for(job_id, {"succeeded"}, timeout_s=120)
    items = every_record(again, job_id)
    assert_each_record_once(items)
    losses = {(i["rank"], i["epoch"]) for i in items if i["name"] == "loss"}
    assert losses == {(r, e) for r in (0, 1) for e in range(1, 9)}
    assert len(items) == len({(i["rank"], i["epoch"], i["name"]) for i in items})


# SQLite only: the PostgreSQL restart is test_server_sigkill_and_restart_keeps_job_and_every_record.
def test_server_down_for_the_end_of_a_job(live_server_factory) -> None:  # type: ignore[no-untyped-def]
    server = live_server_factory(TORCHYARD_TEST_EPOCH_SLEEP_S="0.3")
    with server.client() as c:
        job_id = c.post("/jobs", json={"dataset": "synthetic", "epochs": 6,
                                       "nproc_per_node": 2}).json()["id"]
    job = server.wait_for(job_id, {"running"})
    server.proc.send_signal(signal.SIGKILL)
    server.proc.wait()
    exit_file = server.home / "runs" / str(job_id) / "exit.json"
    deadline = time.monotonic() + 120
    while not exit_file.exists():
        assert time.monotonic() < deadline, "job did not finish while the server was down"
        time.sleep(0.3)
    _assert_gone([job["pid"]])

    again = live_server_factory(server.home, server.port, **ADOPTS_ONLY)
    job = again.wait_for(job_id, {"succeeded"}, timeout_s=30)
    assert job["exit_code"] == 0
    items = every_record(again, job_id)
    assert_each_record_once(items)
    losses = {(i["rank"], i["epoch"]) for i in items if i["name"] == "loss"}
    assert losses == {(r, e) for r in (0, 1) for e in range(1, 7)}


def test_server_killed_between_starting_an_attempt_loop_and_storing_it_keeps_the_job(live_server_factory) -> None:  # type: ignore[no-untyped-def]
    """The crash window: killed after the attempt loop started and before its reference was stored.
    The restarted server adopts the attempt loop from its claim: the job succeeds, once, every record
    once (it used to be failed while its attempt loop ran on).

    The server is held inside the window by the database: a trigger (the test's, dropped
    before the restart) refuses every change to a job that is ``starting``, so the launch's
    write of the loop_pid's reference fails, after the attempt loop started, and the job stays there."""
    env = {"TORCHYARD_TEST_EPOCH_SLEEP_S": "0.3"}
    server = live_server_factory(**env)
    db = server.home / "torchyard.db"
    with sqlite3.connect(db) as conn:
        conn.execute(f"CREATE TRIGGER {WINDOW_TRIGGER} BEFORE UPDATE ON jobs "
                     f"WHEN OLD.state = 'starting' BEGIN SELECT RAISE(ABORT, '{WINDOW}'); END")
    with server.client() as c:
        job_id = c.post("/jobs", json={"dataset": "synthetic", "epochs": 4,
                                       "nproc_per_node": 2}).json()["id"]
    server.await_log(WINDOW, timeout_s=60)  # the reference's write was refused: attempt loop started
    claim = server.home / "runs" / str(job_id) / "claim.json"
    deadline = time.monotonic() + 60
    while not claim.exists():
        assert time.monotonic() < deadline, "the attempt loop never claimed its run"
        time.sleep(0.1)
    with server.client() as c:
        job = c.get(f"/jobs/{job_id}").json()
    assert job["state"] == "starting" and job["pid"] is None  # inside the window
    server.proc.send_signal(signal.SIGKILL)
    server.proc.wait()
    with sqlite3.connect(db) as conn:
        conn.execute(f"DROP TRIGGER {WINDOW_TRIGGER}")
    loop_pid = json.loads(claim.read_text())["pid"]
    assert psutil.pid_exists(loop_pid)

    again = live_server_factory(server.home, server.port, **env, **ADOPTS_ONLY)
    job = again.wait_for(job_id, {"succeeded"}, timeout_s=120)
    assert job["pid"] == loop_pid and len(job["attempts"]) == 1
    items = every_record(again, job_id)
    assert_each_record_once(items)
    losses = {(i["rank"], i["epoch"]) for i in items if i["name"] == "loss"}
    assert losses == {(r, e) for r in (0, 1) for e in range(1, 5)}


def test_hung_rank_fails_with_progress_reason(shared_server: LiveServer) -> None:
    server = shared_server
    spec = {"dataset": "synthetic", "epochs": 2, "nproc_per_node": 2, "heartbeat_timeout_s": 3,
            "max_restarts": 0, "labels": hooks(epoch_sleep_s=120)}
    with server.client() as c:
        job_id = c.post("/jobs", json=spec).json()["id"]
    job = server.wait_for(job_id, {"running"})
    ranks = list(_rank_pids(job["pid"]).values())
    job = server.wait_for(job_id, {"failed"}, timeout_s=60)
    assert "made no progress for 3 s" in job["reason"], job["reason"]
    _assert_gone([job["pid"], *ranks])


def test_deadline_fails_the_job(shared_server: LiveServer) -> None:
    server = shared_server
    spec = {"dataset": "synthetic", "epochs": 100, "nproc_per_node": 1, "max_runtime_s": 4,
            "max_restarts": 3, "labels": hooks(epoch_sleep_s=1)}
    with server.client() as c:
        job_id = c.post("/jobs", json=spec).json()["id"]
    job = server.wait_for(job_id, {"failed"}, timeout_s=60)
    assert job["reason"] == "deadline exceeded" and len(job["attempts"]) == 1


def test_startup_failure_is_not_retried(shared_server: LiveServer, tmp_path) -> None:  # type: ignore[no-untyped-def]
    live_server = shared_server
    spec = {"dataset": "mnist", "dataset_root": str(tmp_path / "nothing"), "nproc_per_node": 2,
            "max_restarts": 3}
    with live_server.client() as c:
        job_id = c.post("/jobs", json=spec).json()["id"]
    job = live_server.wait_for(job_id, {"failed"})
    assert len(job["attempts"]) == 1 and job["attempts"][0]["startup_failure"] is True
    assert job["reason"].startswith("start-up failure (not retried)")


def test_exhausted_restarts_fail_with_last_reason(shared_server: LiveServer) -> None:
    server = shared_server
    spec = {"dataset": "synthetic", "epochs": 2, "nproc_per_node": 2, "max_restarts": 1,
            "labels": hooks(fail_rank=1)}
    with server.client() as c:
        job_id = c.post("/jobs", json=spec).json()["id"]
    job = server.wait_for(job_id, {"failed"})
    assert [a["number"] for a in job["attempts"]] == [1, 2]
    assert "rank 1" in job["reason"] and job["reason"] == job["attempts"][-1]["reason"]
    with httpx.Client(base_url=server.url) as c:
        assert len(c.get(f"/jobs/{job_id}/attempts").json()) == 2


def test_new_job_starts_from_an_earlier_jobs_checkpoint(shared_server: LiveServer) -> None:
    live_server = shared_server
    with live_server.client() as c:
        first = c.post("/jobs", json={"dataset": "synthetic", "epochs": 3,
                                      "nproc_per_node": 2}).json()["id"]
        live_server.wait_for(first, {"succeeded"})
        assert c.post("/jobs", json={"resume_from": 9999}).status_code == 422
        second = c.post("/jobs", json={"dataset": "synthetic", "epochs": 5, "nproc_per_node": 2,
                                       "resume_from": first}).json()["id"]
        live_server.wait_for(second, {"succeeded"})
    items = every_record(live_server, second)
    resumed = {i["rank"]: i["value"] for i in items if i["name"] == "resumed_from_epoch"}
    assert resumed == {0: 3, 1: 3}
    assert {i["epoch"] for i in items if i["name"] == "loss"} == {4, 5}
