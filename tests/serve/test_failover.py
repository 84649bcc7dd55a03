"""Two servers on one PostgreSQL: one supervises, the other serves and stands by, takes over
within the bound when the leader dies or is cut off, and the two never act at once.

Both servers share one home (the run directories: on several hosts that is shared storage) and
give their jobs the standby's URL to post to, as a load balancer in front of both would.
"""

import os
import re
import signal
import time
from collections import Counter

import pytest
from sqlalchemy import create_engine, text

from tests.conftest import LiveServer, every_record, leader_and_standby

pytestmark = [pytest.mark.slow, pytest.mark.parametrize("store", ["postgresql"], indirect=True)]
TAKEOVER_BOUND_S = 10.0  # docs/operations.md
JOB = {"dataset": "synthetic", "synthetic_samples": 64, "nproc_per_node": 2}


def _leader_pid(database_url: str) -> int | None:
    """The pid in the lease owner (``host:pid:nonce``) while the lease is unexpired."""
    engine = create_engine(database_url)
    try:
        with engine.connect() as conn:
            owner = conn.execute(text(
                "SELECT owner FROM supervisor_lease WHERE name = 'supervisor'"
                " AND expires_at > extract(epoch from clock_timestamp())"
            )).scalar()
    finally:
        engine.dispose()
    return int(owner.split(":")[1]) if owner else None


def _wait_leader(database_url: str, pid: int, timeout_s: float) -> float:
    started = time.monotonic()
    while _leader_pid(database_url) != pid:
        assert time.monotonic() - started < timeout_s, f"pid {pid} did not take the lease"
        time.sleep(0.1)
    return time.monotonic() - started


def _assert_every_record_once(server: LiveServer, job_id: int, epochs: int) -> None:
    items = every_record(server, job_id)
    keys = Counter((i["attempt"], i["rank"], i["epoch"], i["step"], i["name"]) for i in items)
    assert max(keys.values()) == 1
    losses = {(i["rank"], i["epoch"]) for i in items if i["name"] == "loss"}
    assert losses == {(r, e) for r in (0, 1) for e in range(1, epochs + 1)}


def _role(server: LiveServer) -> str:
    with server.client() as c:
        return c.get("/healthz").json()["role"]


def _acted_on(log: str, job_id: int) -> bool:
    return re.search(rf"job {job_id}: (launched|ended|finished|re-adopted)", log) is not None


def test_sigkill_of_the_leader_mid_job_fails_over_and_the_old_leader_stands_by(
    live_server_factory, database_url: str,  # type: ignore[no-untyped-def]
) -> None:
    leader, standby = leader_and_standby(live_server_factory)
    assert _leader_pid(database_url) == leader.proc.pid
    assert (_role(leader), _role(standby)) == ("supervisor", "standby")
    with standby.client() as c:
        job_id = c.post("/jobs", json={**JOB, "epochs": 8}).json()["id"]
    standby.wait_for(job_id, {"running"})
    leader.proc.send_signal(signal.SIGKILL)
    leader.proc.wait()
    took = _wait_leader(database_url, standby.proc.pid, TAKEOVER_BOUND_S)
    job = standby.wait_for(job_id, {"succeeded"}, timeout_s=120)
    assert len(job["attempts"]) == 1, job["attempts"]
    _assert_every_record_once(standby, job_id, 8)
    assert _acted_on(standby.log.read_text(), job_id), "the standby never adopted the job"
    print(f"takeover after SIGKILL: {took:.2f} s")

    # The old leader comes back: it serves, but does not act while the standby holds the lease.
    again = live_server_factory(
        leader.home, leader.port,
        TORCHYARD_PUBLIC_URL=standby.url, TORCHYARD_TEST_EPOCH_SLEEP_S="0",
    )
    with again.client() as c:
        second = c.post("/jobs", json={**JOB, "epochs": 1}).json()["id"]
    again.wait_for(second, {"succeeded"}, timeout_s=120)
    assert _leader_pid(database_url) == standby.proc.pid
    assert (_role(again), _role(standby)) == ("standby", "supervisor")
    assert not _acted_on(again.log.read_text(), second)
    assert f"job {second}: launched" in standby.log.read_text()


def test_a_leader_cut_off_stops_acting_before_the_standby_takes_over(
    live_server_factory, database_url: str,  # type: ignore[no-untyped-def]
) -> None:
    """A partition of the lease holder, made with SIGSTOP: it can neither renew nor act. The
    standby takes over once the lease expires (within the bound); when the old leader runs
    again it finds its lease gone and stands by: the job is finished by the new leader only."""
    leader, standby = leader_and_standby(live_server_factory)
    with standby.client() as c:
        job_id = c.post("/jobs", json={**JOB, "epochs": 16}).json()["id"]
    standby.wait_for(job_id, {"running"})
    os.kill(leader.proc.pid, signal.SIGSTOP)
    try:
        took = _wait_leader(database_url, standby.proc.pid, TAKEOVER_BOUND_S)
    finally:
        os.kill(leader.proc.pid, signal.SIGCONT)
    print(f"takeover after the leader was cut off: {took:.2f} s")
    job = standby.wait_for(job_id, {"succeeded"}, timeout_s=120)
    assert len(job["attempts"]) == 1, job["attempts"]
    _assert_every_record_once(standby, job_id, 16)
    assert leader.proc.poll() is None
    assert _leader_pid(database_url) == standby.proc.pid
    assert (_role(leader), _role(standby)) == ("standby", "supervisor")
    old = leader.log.read_text()
    assert "stops supervising" in old or "standing by" in old, old[-2000:]
    assert f"job {job_id}: finished" not in old
    assert f"job {job_id}: finished" in standby.log.read_text()
