"""Teams' quotas and the usage account through the API (the supervisor loop off: nothing runs):
what POST/PATCH /teams accept and refuse (422 naming the field), the member's priority cap and
the quota's submit check, who sees which team and whose usage, and GET /usage as JSON and CSV
(docs/scheduling.md, "Teams"; docs/api.md)."""

import csv
import io
import time
from collections.abc import Iterator

import pytest

from service.app import create_app
from service.settings import Settings
from service.store import usage
from tests.security.people import BOOTSTRAP, Cast, ThreadServer, make_cast, serve_in_thread

ONE = {"name": "q", "dataset": "digits", "epochs": 1, "nproc_per_node": 1}


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ThreadServer, Cast]]:
    settings = Settings(home=tmp_path_factory.mktemp("teamapi") / "home", cpu_slots=4,
                        gpus="none", api_tokens=BOOTSTRAP)
    with serve_in_thread(create_app(settings, run_supervisor=False)) as server, \
            server.client(BOOTSTRAP) as boot:
        yield server, make_cast(boot)


def _field(r) -> str:  # type: ignore[no-untyped-def]
    """The field a 422 names: in ``details``, else first in its message (``field: why``)."""
    assert r.status_code == 422, r.text
    details = r.json()["details"]
    return details[0]["field"] if details else r.json()["message"].split(":")[0]


def test_team_settings_are_checked_and_patch_changes_only_what_is_sent(
    world: tuple[ThreadServer, Cast],
) -> None:
    server, _ = world
    with server.client(BOOTSTRAP) as boot:
        team = boot.post("/teams", json={"name": "settings"}).json()
        assert (team["quota"], team["share"], team["max_priority"], team["slurm_account"]) == (
            None, 1.0, 50, None)
        assert team["usage"]["running_slots"] == 0 and team["fair_share"]["rank"] >= 1
        for body, field in (({"quota": {"max_slots": -1}}, "quota.max_slots"),
                            ({"quota": {"max_slots": True}}, "quota.max_slots"),
                            ({"quota": {"slot_hours": "inf"}}, "quota.slot_hours"),
                            ({"quota": {"period": "weekly"}}, "quota.period"),
                            ({"quota": {"gpus": 2}}, "quota.gpus"),
                            ({"share": 0}, "share"), ({"share": None}, "share"),
                            ({"max_priority": 5000}, "max_priority"),
                            ({"max_priority": "60"}, "max_priority"),
                            ({"slurm_account": "no spaces"}, "slurm_account")):
            assert _field(boot.patch("/teams/settings", json=body)) == field, body
        quota = {"max_slots": 4, "slot_hours": 500, "period": "rolling_30d"}
        team = boot.patch("/teams/settings", json={"quota": quota, "share": 2,
                                                   "slurm_account": "vision-acct"}).json()
        assert (team["quota"], team["share"], team["slurm_account"]) == (
            {**quota, "slot_hours": 500.0}, 2.0, "vision-acct")
        assert team["usage"]["period"] == "rolling_30d" and team["usage"]["resets_at"] is None
        team = boot.patch("/teams/settings", json={"max_priority": 80}).json()
        assert (team["quota"]["max_slots"], team["max_priority"]) == (4, 80)
        team = boot.patch("/teams/settings", json={"quota": {"slot_hours": 800}}).json()
        assert team["quota"] == {"max_slots": 4, "slot_hours": 800.0, "period": "rolling_30d"}, \
            "a merge patch: the quota's other fields stay"
        team = boot.patch("/teams/settings", json={"quota": {"max_slots": None}}).json()
        assert team["quota"] == {"max_slots": None, "slot_hours": 800.0, "period": "rolling_30d"}
        assert boot.patch("/teams/settings", json={"quota": None}).json()["quota"] is None


def test_a_member_submits_at_most_at_the_team_cap_and_a_job_fits_its_quota(
    world: tuple[ThreadServer, Cast],
) -> None:
    server, cast = world
    with server.client(cast.member) as alice, server.client(cast.admin) as admin, \
            server.client(BOOTSTRAP) as boot:
        r = alice.post("/jobs", json={**ONE, "priority": 51})
        assert _field(r) == "priority" and "team a's max_priority 50" in r.json()["message"]
        assert alice.post("/jobs", json={**ONE, "priority": 50}).status_code == 201
        assert admin.post("/jobs", json={**ONE, "priority": 900}).status_code == 201
        assert boot.patch("/teams/a", json={"max_priority": 60}).status_code == 200
        assert alice.post("/jobs", json={**ONE, "priority": 60}).status_code == 201
        assert boot.patch("/teams/a", json={"quota": {"max_slots": 1}}).status_code == 200
        try:
            r = alice.post("/jobs", json={**ONE, "nproc_per_node": 2})
            assert _field(r) == "nproc_per_node"
            assert "team a's quota is max_slots 1" in r.json()["message"]
            borrowing = {**ONE, "nproc_per_node": 2, "preemptible": True}
            assert alice.post("/jobs", json=borrowing).status_code == 201
            sweep = {"name": "s", "spec": {**ONE, "priority": 70},
                     "space": {"lr": {"type": "uniform", "low": 0.01, "high": 0.1}},
                     "max_trials": 2}
            r = admin.post("/sweeps", json=sweep)
            assert r.status_code == 201, "an admin of no team: no cap"
        finally:
            boot.patch("/teams/a", json={"quota": None, "max_priority": 50})


def _record_runs(server: ThreadServer, alice_job: int, bob_job: int) -> float:
    """Runs of a's and b's jobs, as the supervisor would have recorded them."""
    now = time.time()
    with server.app.state.session_factory() as session:
        usage.open_run(session, alice_job, 2, now - 300)
        usage.close_runs(session, alice_job, now - 200)  # 200 slot-seconds
        usage.open_run(session, bob_job, 1, now - 50)  # still holding its slot
        session.commit()
    return now


def test_usage_is_the_callers_team_or_everyone_for_an_admin_as_json_or_csv(
    world: tuple[ThreadServer, Cast],
) -> None:
    server, cast = world
    with server.client(cast.member) as alice, server.client(cast.other) as bob, \
            server.client(cast.admin) as admin, server.client(cast.viewer) as vic:
        a_job = alice.post("/jobs", json=ONE).json()["id"]
        b_job = bob.post("/jobs", json=ONE).json()["id"]
        now = _record_runs(server, a_job, b_job)
        since = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now - 400))
        mine = vic.get("/usage", params={"group_by": "job", "since": since}).json()
        assert [(r["team"], r["user"], r["job_id"], r["slot_seconds"], r["attempts"])
                for r in mine["items"] if r["job_id"] == a_job] == [("a", "alice", a_job, 200, 1)]
        assert {r["team"] for r in mine["items"]} == {"a"}, "a viewer reads their team's only"
        every = admin.get("/usage", params={"since": since}).json()["items"]
        teams = {r["team"]: r for r in every}
        assert teams["a"]["slot_seconds"] >= 200 and 45 < teams["b"]["slot_seconds"] < 120
        text = admin.get("/usage", params={"group_by": "user", "since": since},
                         headers={"accept": "text/csv"})
        assert text.headers["content-type"].startswith("text/csv")
        rows = list(csv.DictReader(io.StringIO(text.text)))
        assert list(rows[0]) == ["team", "user", "job_id", "slot_seconds", "jobs", "attempts"]
        assert {(r["team"], r["user"], r["job_id"]) for r in rows} >= {("a", "alice", ""),
                                                                         ("b", "bob", "")}
        assert _field(admin.get("/usage", params={"since": since, "until": since})) == "since"
        assert _field(admin.get("/usage", params={"group_by": "gpu"})) == "group_by"
        day = admin.get("/usage", params={"since": "2026-01-01"})
        assert day.status_code == 200 and day.json()["since"].startswith("2026-01-01T00:00:00")


def test_a_member_sees_their_own_team_only(world: tuple[ThreadServer, Cast]) -> None:
    server, cast = world
    with server.client(cast.member) as alice, server.client(cast.admin) as admin:
        assert [t["name"] for t in alice.get("/teams").json()] == ["a"]
        assert alice.get("/teams/b").status_code == 404
        assert alice.get("/teams/a").json()["fair_share"]["rank"] >= 1
        assert {"a", "b"} <= {t["name"] for t in admin.get("/teams").json()}
        assert alice.patch("/teams/a", json={"share": 5}).status_code == 403


def test_a_sweeps_parallel_is_capped_by_its_teams_max_slots_unless_its_trials_borrow(
    world: tuple[ThreadServer, Cast],
) -> None:
    from service.domain.sweeps.driver import SweepDriver
    from service.domain.sweeps.spec import SweepSpec
    from service.store import sweeps as sweepstore

    server, cast = world
    space = {"lr": {"type": "uniform", "low": 0.01, "high": 0.1}}
    with server.client(BOOTSTRAP) as boot:
        assert boot.post("/teams", json={"name": "sweepers", "quota": {"max_slots": 5}}).status_code == 201
    factory = server.app.state.session_factory
    found = {}
    for name, base, team in (("two-rank", {**ONE, "nproc_per_node": 2}, "sweepers"),
                             ("borrowing", {**ONE, "nproc_per_node": 2, "preemptible": True},
                              "sweepers"),
                             ("big", {**ONE, "nproc_per_node": 4, "nnodes": 2}, "sweepers"),
                             ("no-team", {**ONE, "nproc_per_node": 2}, None)):
        spec = SweepSpec.model_validate({"spec": base, "space": space, "parallel": 8})
        with factory() as session:
            sweep = sweepstore.create_sweep(session, name, 0, spec.model_dump(mode="json"),
                                            owner="alice", team=team)
            found[name] = SweepDriver._parallel(session, sweep, spec)
            session.rollback()
    assert found == {"two-rank": 2, "borrowing": 8, "big": 1, "no-team": 8}
