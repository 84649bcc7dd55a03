"""Teams on a real 2-slot box with real CPU jobs (docs/scheduling.md, "Teams"): a team at its
quota waits saying so, its preemptible job borrows the idle slot, and another team's job takes
it back — the borrower is paused with a checkpoint at its next epoch's end, resumes on its own
and keeps every (rank, epoch) once — with the usage account equal to the attempts' wall time;
fair share before priority; a budget spent mid-job; a SIGKILLed server that counts the borrowed
job's run once. One module-scoped server (SQLite; the store's statements run on both stores in
tests/store/test_usage_store.py), its teams and members made through its API."""

import signal
import sqlite3
import time
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path

import httpx
import pytest

from tests.conftest import (
    ADOPTS_ONLY,
    LiveServer,
    _copy_sqlite,
    _start_server,
    _stop_server,
    every_record,
    hooks,
)
from tests.security.people import BOOTSTRAP, new_token

EPOCH_S = 0.5
# team → its quota; every team has one member, named after it
TEAMS = {"a": {"max_slots": 1}, "b": {"max_slots": 1}, "c": None, "d": None,
         "e": {"slot_hours": 0.001}}


def spec(epochs: int, **more: object) -> dict:
    return {"dataset": "synthetic", "synthetic_samples": 64, "epochs": epochs,
            "nproc_per_node": 1, "labels": hooks(epoch_sleep_s=EPOCH_S), **more}


def _members(server: LiveServer, teams: dict) -> dict[str, str]:
    """Each team made with its quota, and a member's token for it."""
    tokens = {}
    with server.client() as boot:
        for team, quota in teams.items():
            assert boot.post("/teams", json={"name": team, "quota": quota}).status_code == 201
            assert boot.post("/users", json={"name": f"{team}-user", "team": team}).status_code == 201
            tokens[team] = new_token(boot, f"{team}-user")
    return tokens


@pytest.fixture(scope="module")
def box(
    tmp_path_factory: pytest.TempPathFactory, _migrated_sqlite: Path,
) -> Iterator[tuple[LiveServer, dict[str, str]]]:
    home = tmp_path_factory.mktemp("fairshare") / "home"
    _copy_sqlite(_migrated_sqlite, home)
    server = _start_server(home, {"TORCHYARD_CPU_SLOTS": "2", "TORCHYARD_API_TOKENS": BOOTSTRAP})
    server.token = BOOTSTRAP
    try:
        yield server, _members(server, TEAMS)
    finally:
        _stop_server(server)


def _as(server: LiveServer, token: str) -> httpx.Client:
    client = server.client()
    client.headers["authorization"] = f"Bearer {token}"
    return client


def _until(client: httpx.Client, job_id: int, check: Callable[[dict], bool],
           timeout_s: float = 60) -> dict:
    deadline = time.monotonic() + timeout_s
    while not check(job := client.get(f"/jobs/{job_id}").json()):
        assert job["state"] not in ("failed", "cancelled"), job
        assert time.monotonic() < deadline, job
        time.sleep(0.1)
    return job


def _utc(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _holds(run: tuple[float, float], attempt: dict) -> None:
    """The run covers the attempt and ends within 1 s of it. Its start is the launch: before
    the attempt by the attempt loop's start-up (~0.2 s on a quiet machine; more under load),
    time its slots are held too."""
    start, end = run
    assert start <= attempt["started_at"] and attempt["ended_at"] <= end <= attempt["ended_at"] + 1, (
        run, attempt["started_at"], attempt["ended_at"])


def _runs(server: LiveServer, job_id: int) -> list[tuple[float, float]]:
    """The job's runs in the usage account, from the server's own database (1 slot each)."""
    with sqlite3.connect(server.home / "torchyard.db") as db:
        return db.execute("SELECT started_at, ended_at FROM slot_usage WHERE job_id = ? "
                          "ORDER BY id", (job_id,)).fetchall()


def test_a_borrowed_slot_is_taken_back_and_the_borrower_resumes_losing_nothing(
    box: tuple[LiveServer, dict[str, str]],
) -> None:
    server, tokens = box
    with _as(server, tokens["a"]) as a, _as(server, tokens["b"]) as b, server.client() as admin:
        held = a.post("/jobs", json=spec(200)).json()["id"]
        server.wait_for(held, {"running"})
        over = a.post("/jobs", json=spec(1)).json()["id"]
        job = _until(a, over, lambda j: j["waiting_reason"] is not None)
        assert job["waiting_reason"] == "team a holds 1 of its 1 slot"
        a.post(f"/jobs/{over}/cancel")
        borrower = a.post("/jobs", json=spec(8, preemptible=True)).json()["id"]
        server.wait_for(borrower, {"running"})
        usage = a.get("/teams/a").json()["usage"]
        assert (usage["running_slots"], usage["borrowed_slots"]) == (2, 1)
        while not [r for r in every_record(server, borrower) if r["name"] == "loss"]:
            time.sleep(0.1)  # in its first epochs
        asked = time.time()
        reclaimer = b.post("/jobs", json=spec(2)).json()["id"]
        job = _until(a, borrower, lambda j: j["state"] == "queued" and j["waiting_reason"])
        assert job["reason"] == "paused to return 1 slot to team b" and job["preemptions"] == 1
        assert job["waiting_reason"].startswith("paused to return 1 slot to team b; needs 1 CPU")
        first = job["attempts"][0]
        assert first["paused"] is True
        done = server.wait_for(reclaimer, {"succeeded"})
        job = server.wait_for(borrower, {"succeeded"})
        a.post(f"/jobs/{held}/cancel")
        rows = admin.get("/usage", params={"group_by": "job"}).json()["items"]
    records = [r for r in every_record(server, borrower) if r["name"] == "loss"]
    seen = Counter((r["rank"], r["epoch"]) for r in records)
    assert set(seen) == {(0, e) for e in range(1, 9)} and max(seen.values()) == 1
    # Paused within the checkpoint time + 1 s: the epoch it was in ends, its checkpoint is
    # saved, and it reports nothing after. An epoch here is EPOCH_S plus its compute.
    epoch_times = sorted(r["time"] for r in records if r["attempt"] == 1)
    epoch_s = max(b2 - b1 for b1, b2 in zip(epoch_times, epoch_times[1:], strict=False)) \
        if len(epoch_times) > 1 else EPOCH_S
    assert epoch_times[-1] - asked <= epoch_s + 1.0, (epoch_times[-1] - asked, epoch_s)
    assert _utc(done["started_at"]) >= first["ended_at"] - 1, "it started on the freed slot"
    # The account: one run per start (the pause ended the first), each holding its attempt
    # from the launch (the server's clock, before the attempt loop's start-up) to within 1 s
    # of its end; GET /usage sums them.
    by_job = {r["job_id"]: r for r in rows}
    assert (by_job[borrower]["attempts"], by_job[borrower]["team"]) == (2, "a")
    for finished in (job, done):
        runs = _runs(server, finished["id"])
        assert len(runs) == len(finished["attempts"])
        for run, attempt in zip(runs, finished["attempts"], strict=True):
            _holds(run, attempt)
        assert by_job[finished["id"]]["slot_seconds"] == pytest.approx(
            sum(end - start for start, end in runs), abs=0.01)
    assert _runs(server, done["id"])[0][0] == pytest.approx(_utc(done["started_at"]), abs=0.1)

def test_the_team_with_less_recent_usage_starts_first_over_a_higher_priority(
    box: tuple[LiveServer, dict[str, str]],
) -> None:
    server, tokens = box
    with _as(server, tokens["c"]) as c, _as(server, tokens["d"]) as d, server.client() as admin:
        server.wait_for(c.post("/jobs", json=spec(1)).json()["id"], {"succeeded"})  # c's usage
        blockers = [admin.post("/jobs", json=spec(200)).json()["id"] for _ in range(2)]
        for blocker in blockers:
            server.wait_for(blocker, {"running"})
        urgent = c.post("/jobs", json=spec(1, priority=40)).json()["id"]
        fair = d.post("/jobs", json=spec(1)).json()["id"]
        job = _until(c, urgent, lambda j: "by fair share" in (j["waiting_reason"] or ""))
        assert job["waiting_reason"] == f"needs 1 CPU slot; 0 free, behind team d's job {fair} " \
            "by fair share"
        teams = {t["name"]: t["fair_share"] for t in admin.get("/teams").json()}
        assert teams["c"]["factor"] > teams["d"]["factor"] == 0
        assert teams["d"]["rank"] < teams["c"]["rank"]
        admin.post(f"/jobs/{blockers[1]}/cancel")  # one slot frees
        server.wait_for(fair, {"starting", "running", "succeeded"})
        assert c.get(f"/jobs/{urgent}").json()["state"] == "queued"
        admin.post(f"/jobs/{blockers[0]}/cancel")
        server.wait_for(urgent, {"succeeded"})


def test_a_budget_spent_mid_job_lets_it_finish_holds_the_next_and_a_patch_releases_it(
    box: tuple[LiveServer, dict[str, str]],
) -> None:
    server, tokens = box
    with _as(server, tokens["e"]) as e, server.client() as admin:
        running = e.post("/jobs", json=spec(12)).json()["id"]
        server.wait_for(running, {"running"})
        deadline = time.monotonic() + 60
        while (team := e.get("/teams/e").json())["usage"]["budget_spent"] is None:
            assert time.monotonic() < deadline, team
            time.sleep(0.2)
        assert team["usage"]["budget_spent"].startswith("team e used ")
        waiting = e.post("/jobs", json=spec(1)).json()["id"]
        job = _until(e, waiting, lambda j: j["waiting_reason"] is not None)
        assert " of 0.001 slot-hours this month; resets " in job["waiting_reason"]
        server.wait_for(running, {"succeeded"})  # not stopped
        job = e.get(f"/jobs/{waiting}").json()
        assert job["state"] == "queued" and "slot-hours this month" in job["waiting_reason"]
        r = admin.patch("/teams/e", json={"quota": {"slot_hours": 1000}})
        assert r.status_code == 200 and r.json()["usage"]["budget_spent"] is None
        server.wait_for(waiting, {"succeeded"}, timeout_s=60)


def test_a_server_killed_during_a_borrowed_job_counts_its_run_once(
    live_server_factory: Callable[..., LiveServer],
) -> None:
    server = live_server_factory(TORCHYARD_CPU_SLOTS="2", TORCHYARD_API_TOKENS=BOOTSTRAP)
    server.token = BOOTSTRAP
    tokens = _members(server, {"f": {"max_slots": 0}})  # every job of f borrows
    with _as(server, tokens["f"]) as f:
        job_id = f.post("/jobs", json=spec(10, preemptible=True)).json()["id"]
        server.wait_for(job_id, {"running"})
        assert f.get("/teams/f").json()["usage"]["borrowed_slots"] == 1
    server.proc.send_signal(signal.SIGKILL)
    server.proc.wait()
    again = live_server_factory(server.home, server.port, TORCHYARD_CPU_SLOTS="2",
                                TORCHYARD_API_TOKENS=BOOTSTRAP, **ADOPTS_ONLY)
    again.token = BOOTSTRAP
    job = again.wait_for(job_id, {"succeeded"})
    with again.client() as admin:
        rows = admin.get("/usage", params={"group_by": "job"}).json()["items"]
    (row,) = [r for r in rows if r["job_id"] == job_id]
    assert (row["attempts"], len(job["attempts"])) == (1, 1), "one run, counted once"
    ((start, end),) = _runs(again, job_id)
    _holds((start, end), job["attempts"][0])
    assert start == pytest.approx(_utc(job["started_at"]), abs=0.1), "opened at the launch"
    assert row["slot_seconds"] == pytest.approx(end - start, abs=0.01)
