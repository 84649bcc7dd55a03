"""Jobs with warm ranks on (``TORCHYARD_WARM_RANKS``), through a real server, real torchrun and
the real warm server: reporting, cancel, heartbeat, deadline, a killed rank's restart, logs,
and that no process of a job outlives it."""

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from service.executor.warmpool import ask, socket_path
from tests.conftest import (
    LiveServer,
    _copy_sqlite,
    _start_server,
    _stop_server,
    assert_each_record_once,
    every_record,
    hooks,
)
from tests.warm.warmjobs import WARM_ENV, rank_logs, wait_served, wait_warm


@pytest.fixture(scope="module")
def _warm_server(
    tmp_path_factory: pytest.TempPathFactory, _migrated_sqlite: Path
) -> Iterator[LiveServer]:
    """One server with a pool of 3 for the file's tests that leave its warm server alive (the
    broken pool's test kills it: a server of its own); their rank hooks are per job."""
    home = tmp_path_factory.mktemp("warm-jobs") / "home"
    _copy_sqlite(_migrated_sqlite, home)
    server = _start_server(home, WARM_ENV)
    yield server
    _stop_server(server)


@pytest.fixture
def server(_warm_server: LiveServer) -> LiveServer:
    """The file's warm server once its pool is full again (the last test's job used some)."""
    wait_warm(_warm_server)
    return _warm_server


def start_warm(factory: Callable[..., LiveServer], **env: str) -> LiveServer:
    server = factory(**WARM_ENV, **env)
    wait_warm(server)
    return server


def warm_pids(server: LiveServer, job_id: int) -> dict[str | None, int]:
    """rank (None: torchrun's agent) → pid of the warm processes running job ``job_id``."""
    status = ask(socket_path(server.home), {"op": "status"}) or {}
    return {r["rank"]: r["pid"] for r in status.get("ranks", []) if r["job_id"] == str(job_id)}


def wait_warm_ranks(server: LiveServer, job_id: int, ranks: int) -> dict[str | None, int]:
    deadline = time.monotonic() + 60
    while len(pids := warm_pids(server, job_id)) < ranks + 1:
        assert time.monotonic() < deadline, f"warm ranks of job {job_id}: {pids}"
        time.sleep(0.1)
    return pids


def assert_gone(pids: list[int], timeout_s: float = 15) -> None:
    deadline = time.monotonic() + timeout_s
    for pid in pids:
        while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline, f"pid {pid} survived"
            time.sleep(0.1)


@pytest.mark.slow
def test_warm_job_reports_and_pool_is_reported_without_cuda(server: LiveServer) -> None:
    with server.client() as c:
        before = c.get("/resources").json()["warm"]
        assert before["cuda_initialized"] is False and before["pool_size"] == 3
        assert before["memory_bytes"] > 0 and before["memory_limit_bytes"] == 4096 * 2**20
        job_id = c.post("/jobs", json={"dataset": "synthetic", "epochs": 2,
                                       "nproc_per_node": 2}).json()["id"]
        job = server.wait_for(job_id, {"succeeded"})
        losses = {(m["rank"], m["epoch"]) for m in
                  c.get(f"/jobs/{job_id}/metrics").json()["items"] if m["name"] == "loss"}
        assert losses == {(r, e) for r in (0, 1) for e in (1, 2)}
        assert job["attempts"][0]["rank_exit_codes"] == {"0": 0, "1": 0}
        wait_served(server, before["served"] + 3)  # torchrun's agent and both ranks
        metrics = c.get("/metrics").text
    assert "starting cold" not in rank_logs(server, job_id)
    for rank in (0, 1):
        with server.client() as c:
            r = c.get(f"/jobs/{job_id}/logs", params={"rank": rank})
        assert r.status_code == 200, r.text
    assert 'torchyard_warm_processes{state="idle"}' in metrics
    assert "torchyard_warm_handoffs_total" in metrics
    assert "torchyard_warm_ready 1.0" in metrics


@pytest.mark.slow
def test_cancel_warm_job_leaves_no_process(server: LiveServer) -> None:
    with server.client() as c:
        job_id = c.post("/jobs", json={"dataset": "synthetic", "epochs": 1000, "nproc_per_node": 2,
                                       "labels": hooks(epoch_sleep_s=2)}).json()["id"]
        job = server.wait_for(job_id, {"running"})
        warm = wait_warm_ranks(server, job_id, 2)
        leader = psutil.Process(job["pid"])
        members = [leader.pid, *(p.pid for p in leader.children(recursive=True))]
        # Everything under the warm ranks too (the ranks' relays hang off the warm agent).
        for pid in list(warm.values()):
            members += [p.pid for p in psutil.Process(pid).children(recursive=True)]
        r = c.post(f"/jobs/{job_id}/cancel")
        assert r.status_code == 200 and r.json()["state"] == "cancelled"
        assert_gone([*members, *warm.values()])
        server.wait_for(job_id, {"cancelled"}, allowed={"cancelled"})
    # Gone above may mean a zombie: the warm server lists it until it has reaped it (awaited).
    deadline = time.monotonic() + 15
    while (left := warm_pids(server, job_id)) != {}:
        assert time.monotonic() < deadline, f"the warm server still runs {left} of the job"
        time.sleep(0.1)


@pytest.mark.slow
def test_sigkill_of_a_warm_rank_restarts_from_checkpoint(server: LiveServer) -> None:
    """A rank SIGKILLed mid-epoch: the next attempt resumes both ranks from the last checkpoint
    and every record is kept once. (Cold ranks: the Slurm executor's
    tests/slurm/test_slurm.py::test_sigkill_rank_on_second_node_restarts_from_checkpoint.)"""
    spec = {"dataset": "synthetic", "epochs": 6, "nproc_per_node": 2, "max_restarts": 1,
            "labels": hooks(epoch_sleep_s=0.7)}
    with server.client() as c:
        job_id = c.post("/jobs", json=spec).json()["id"]
        server.wait_for(job_id, {"running"})
        deadline = time.monotonic() + 90
        while sum(m["name"] == "loss" for m in
                  c.get(f"/jobs/{job_id}/metrics").json()["items"]) < 4:
            assert time.monotonic() < deadline
            time.sleep(0.3)
    os.kill(wait_warm_ranks(server, job_id, 2)["1"], signal.SIGKILL)
    job = server.wait_for(job_id, {"succeeded"}, timeout_s=120)
    assert [a["number"] for a in job["attempts"]] == [1, 2]
    assert job["attempts"][0]["exit_code"] != 0
    codes = job["attempts"][0]["rank_exit_codes"]
    assert codes["1"] == -signal.SIGKILL and codes.get("0", -signal.SIGTERM) != 0, codes
    assert job["attempts"][1]["rank_exit_codes"] == {"0": 0, "1": 0}
    items = every_record(server, job_id)
    assert_each_record_once(items)
    resumed = {i["rank"]: i["value"] for i in items
               if i["attempt"] == 2 and i["name"] == "resumed_from_epoch"}
    assert set(resumed) == {0, 1} and resumed[0] == resumed[1] >= 2, resumed
    final = {(i["rank"], i["epoch"]) for i in items if i["attempt"] == 2 and i["name"] == "loss"}
    assert final == {(r, e) for r in (0, 1) for e in range(int(resumed[0]) + 1, 7)}


@pytest.mark.slow
@pytest.mark.parametrize("case", ["heartbeat", "deadline"])
def test_heartbeat_and_deadline_stop_warm_ranks(server: LiveServer, case: str) -> None:
    if case == "heartbeat":
        spec = {"dataset": "synthetic", "epochs": 2, "nproc_per_node": 2,
                "heartbeat_timeout_s": 3, "max_restarts": 0, "labels": hooks(epoch_sleep_s=120)}
        reason = "made no progress for 3 s"
    else:
        # Room to be seen running on a loaded machine before the deadline stops it.
        spec = {"dataset": "synthetic", "epochs": 100, "nproc_per_node": 2, "max_runtime_s": 15,
                "max_restarts": 3, "labels": hooks(epoch_sleep_s=1)}
        reason = "deadline exceeded"
    with server.client() as c:
        job_id = c.post("/jobs", json=spec).json()["id"]
    server.wait_for(job_id, {"running"})
    warm = wait_warm_ranks(server, job_id, 2)
    job = server.wait_for(job_id, {"failed"}, timeout_s=90)
    assert reason in job["reason"] and len(job["attempts"]) == 1, job["reason"]
    assert_gone([job["pid"], *warm.values()])


def test_a_warm_server_slow_to_answer_keeps_its_running_ranks(server: LiveServer) -> None:
    """A warm server that misses a status check (SIGSTOPped past the 2 s a check waits, as a
    loaded host can delay it) is not killed: it holds its lock, so it is alive, and killing it
    would kill every warm rank. Jobs start cold meanwhile; the running job ends warm, once."""
    with server.client() as c:
        job_id = c.post("/jobs", json={"dataset": "synthetic", "epochs": 2, "nproc_per_node": 2,
                                       "labels": hooks(epoch_sleep_s=2)}).json()["id"]
    wait_warm_ranks(server, job_id, 2)
    pid = ask(socket_path(server.home), {"op": "status"})["pid"]  # type: ignore[index]
    os.kill(pid, signal.SIGSTOP)
    try:
        deadline = time.monotonic() + 30
        with server.client() as c:  # until the pool has missed an answer
            while (warm := c.get("/resources").json()["warm"])["state"] == "ready":
                assert time.monotonic() < deadline, warm
                time.sleep(0.2)
    finally:
        with contextlib.suppress(ProcessLookupError):  # gone: the pool killed it
            os.kill(pid, signal.SIGCONT)
    job = server.wait_for(job_id, {"succeeded", "failed"})
    assert job["state"] == "succeeded" and len(job["attempts"]) == 1, job
    assert job["attempts"][0]["rank_exit_codes"] == {"0": 0, "1": 0}
    assert wait_warm(server)["restarts"] == 0
    assert ask(socket_path(server.home), {"op": "status"})["pid"] == pid  # type: ignore[index]


@pytest.mark.slow
def test_broken_pool_starts_jobs_cold_saying_so_and_is_replaced(
    live_server_factory: Callable[..., LiveServer],
) -> None:
    server = start_warm(live_server_factory)
    with server.client() as c:
        status = ask(socket_path(server.home), {"op": "status"})
        assert status is not None
        os.kill(status["pid"], signal.SIGKILL)  # its idle children die with it (PDEATHSIG)
        job_id = c.post("/jobs", json={"dataset": "synthetic", "epochs": 1,
                                       "nproc_per_node": 2}).json()["id"]
        job = server.wait_for(job_id, {"succeeded"})
        assert job["attempts"][0]["rank_exit_codes"] == {"0": 0, "1": 0}
    # Each relay said why it went cold in its rank's log, or the attempt loop did in the attempt's log
    # (when the pool had already noticed: it then starts plain torchrun).
    assert "warm start unavailable" in rank_logs(server, job_id), rank_logs(server, job_id)
    warm = wait_warm(server)
    assert warm["restarts"] >= 1 and warm["state"] == "ready", warm
    assert_gone(status["idle_pids"])


def test_servers_naming_one_warm_dir_share_its_warm_server_until_the_last_one_stops(
    live_server_factory: Callable[..., LiveServer], tmp_path: Path,
) -> None:
    """Two servers (two homes) with one ``TORCHYARD_WARM_DIR``: one warm server serves both;
    stopping the server that started it leaves it serving the other (it only gives its
    ownership back); it drains once the last owner stopped."""
    directory = tmp_path / "one-warm"
    first = start_warm(live_server_factory, TORCHYARD_WARM_DIR=str(directory))
    second = start_warm(live_server_factory, TORCHYARD_WARM_DIR=str(directory))
    path = socket_path(first.home, directory)
    assert first.warm_socket == second.warm_socket == path
    pid = ask(path, {"op": "status"})["pid"]  # type: ignore[index]
    assert not (first.home / "warm").exists() and not (second.home / "warm").exists()
    _stop_server(first)  # the pool that started it
    status = ask(path, {"op": "status"})
    assert status is not None and status["pid"] == pid and not status["draining"], status
    served = wait_warm(second)["served"]
    with second.client() as c:
        job_id = c.post("/jobs", json={"dataset": "synthetic", "epochs": 1}).json()["id"]
    second.wait_for(job_id, {"succeeded"})
    wait_served(second, served + 2)  # the agent and the rank: warm, from the same server
    assert "starting cold" not in rank_logs(second, job_id)
    assert ask(path, {"op": "status"})["pid"] == pid  # type: ignore[index]
    _stop_server(second)
    try:
        psutil.Process(pid).wait(timeout=30)  # drained: its last owner is gone
    except psutil.NoSuchProcess:
        pass  # gone already
