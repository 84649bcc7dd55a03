"""Roles × routes: every route of the app has a rule (service/api/authz.py), and on a real
server with real personal tokens each role gets what its rule says, on every route. Another
team's job or sweep answers, on every route under it, exactly what a missing one answers.

One module-scoped server (uvicorn in a thread, the supervisor loop off: nothing runs; the jobs
stay queued) on SQLite, and the visibility queries again on PostgreSQL.
"""

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from service.api import authz
from service.api.authz import Rule
from service.app import create_app
from service.settings import Settings
from tests.conftest import both_stores
from tests.security.people import (
    BOOTSTRAP,
    Cast,
    ThreadServer,
    make_cast,
    new_token,
    operations,
    serve_in_thread,
)

DIGITS = {"name": "roles", "dataset": "digits", "epochs": 1, "nproc_per_node": 1}
SWEEP = {"name": "s", "spec": DIGITS, "space": {"lr": {"type": "uniform", "low": 0.01,
                                                       "high": 0.1}},
         "max_trials": 2}
ROLES = ("admin", "member", "viewer", "other", "none")
# An allowed caller's 404 that is not about who they are: the route's own target is missing.
NATURAL_404 = {("GET", "/jobs/{job_id}/artifacts/{path:path}"), ("GET", "/packages/{digest}")}
MISSING_ID = 987_654_321


def _settings(home: Path, database_url: str | None = None) -> Settings:
    return Settings(home=home, cpu_slots=4, gpus="none", api_tokens=BOOTSTRAP,
                    database_url=database_url)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ThreadServer, Cast]]:
    app = create_app(_settings(tmp_path_factory.mktemp("roles") / "home"), run_supervisor=False)
    with serve_in_thread(app) as server, server.client(BOOTSTRAP) as boot:
        yield server, make_cast(boot)


def test_every_route_has_a_rule_and_every_rule_a_route(tmp_path: Path) -> None:
    app = create_app(_settings(tmp_path / "home"), run_supervisor=False)
    routes = set(operations(app))
    assert sorted(r for r in routes if authz.rule_for(*r) is None) == []
    assert sorted(set(authz.RULES) - routes) == []  # no stale rule


def test_an_unknown_route_is_refused_by_the_rule_table() -> None:
    from service.api.middleware.signin import BOOTSTRAP as ADMIN_PRINCIPAL

    assert authz.refusal(None, ADMIN_PRINCIPAL, {}) is not None  # fail closed, even for admin


def _expected(rule: Rule, role: str, method: str, template: str) -> str:
    """``ok``, ``401``, ``403`` or ``hidden`` (404, word for word a missing target's)."""
    if rule is Rule.public:
        return "ok"
    if role == "none":
        return "401"
    if rule is Rule.job_token:
        return "403"
    if rule is Rule.signed_in:
        return "ok"
    if rule is Rule.admin:
        return "ok" if role == "admin" else "403"
    if rule is Rule.member:
        return "403" if role == "viewer" else "ok"
    if rule is Rule.team_viewer:
        return "hidden" if role == "other" else "ok"
    if rule is Rule.team_member:
        return {"viewer": "403", "other": "hidden"}.get(role, "ok")
    assert rule is Rule.self_or_admin  # the targets are alice's (the member's)
    if template == "/tokens/{token_id}":
        return "hidden" if role in ("viewer", "other") else "ok"
    return "ok" if role in ("admin", "member") else "403"


def _send(client: httpx.Client, method: str, path: str, token: str | None) -> tuple[int, dict]:
    headers = {"authorization": f"Bearer {token}"} if token else {}
    body = {"records": []} if path.endswith("/records") else {}
    kwargs = {"json": body} if method in ("POST", "PUT", "PATCH") else {}
    if method == "POST" and path == "/jobs":
        kwargs = {"json": DIGITS}
    with client.stream(method, path, headers=headers, **kwargs) as response:  # SSE: status only
        if response.headers.get("content-type", "").startswith("application/json"):
            response.read()
            return response.status_code, response.json()
        return response.status_code, {}


def test_each_role_on_every_route(world: tuple[ThreadServer, Cast]) -> None:
    server, cast = world
    with server.client(cast.member) as alice:
        jobs = {op: alice.post("/jobs", json=DIGITS).json()["id"]
                for op in ("read", "cancel", "pause", "resume", "delete")}
        sweep = alice.post("/sweeps", json=SWEEP).json()["id"]
    with server.client(BOOTSTRAP) as boot:
        spare = boot.post("/users/alice/tokens", json={"name": "spare"}).json()["id"]
        assert boot.post(f"/jobs/{jobs['resume']}/pause").status_code == 200

    def fill(method: str, template: str, job: int | None = None) -> str:
        op = template.rsplit("/", 1)[-1] if method == "POST" else (
            "delete" if method == "DELETE" else "read")
        values = {"{job_id}": str(job or jobs.get(op, jobs["read"])), "{sweep_id}": str(sweep),
                  "{token_id}": str(spare), "{path:path}": "missing.txt",
                  "{digest}": "sha256:" + "0" * 64,
                  "{name}": "a" if template.startswith("/teams") else (
                      "swagger-ui.css" if template.startswith("/static/swagger") else
                      "app.js" if template.startswith("/static") else "alice")}
        path = re.sub(r"\{[^}]+\}", lambda m: values[m[0]], template)
        return path + ("?timeout=0" if template.endswith("/wait") else "")

    failures = []
    with httpx.Client(base_url=server.url, timeout=10) as client:
        for method, template in operations(server.app):
            rule = authz.rule_for(method, template)
            assert rule is not None
            for role in ("other", "viewer", "none", "member", "admin"):  # the deniable first
                want = _expected(rule, role, method, template)
                path = fill(method, template)
                got, body = _send(client, method, path, cast.token(role))
                if want == "hidden" and ("{job_id}" in template or "{sweep_id}" in template):
                    # word for word what the same route says of a job or sweep that is not there
                    target = re.search(r"/(?:jobs|sweeps)/(\d+)", path)[1]  # type: ignore[index]
                    gone = path.replace(f"/{target}", f"/{MISSING_ID}", 1)
                    _, missing = _send(client, method, gone, cast.admin)
                    ok = got == 404 and body["message"] == missing["message"].replace(
                        str(MISSING_ID), target)
                elif want == "hidden":
                    ok = got == 404
                elif want == "ok":
                    ok = got not in (401, 403) and got < 500 and (
                        got != 404 or (method, template) in NATURAL_404)
                else:
                    ok = got == int(want)
                if not ok:
                    failures.append(f"{method} {template} as {role}: {got} (want {want})")
    assert failures == [], "\n".join(failures)


def test_a_viewer_cannot_submit_and_a_member_submits_as_their_team(
    world: tuple[ThreadServer, Cast],
) -> None:
    server, cast = world
    with server.client(cast.viewer) as vic, server.client(cast.member) as alice:
        refused = vic.post("/jobs", json=DIGITS)
        assert refused.status_code == 403 and "viewer" in refused.json()["message"]
        job = alice.post("/jobs", json={**DIGITS, "labels": {"owner": "mallory"}}).json()
        assert (job["owner"], job["team"]) == ("alice", "a")
        assert vic.get(f"/jobs/{job['id']}").json()["owner"] == "alice"  # a viewer reads it
        refused = vic.post(f"/jobs/{job['id']}/cancel")
        assert refused.status_code == 403
    with server.client(cast.other) as bob:
        assert job["id"] not in [j["id"] for j in bob.get("/jobs").json()["items"]]


def test_a_spec_cannot_set_its_owner(world: tuple[ThreadServer, Cast]) -> None:
    server, cast = world
    with server.client(cast.member) as alice:
        r = alice.post("/jobs", json={**DIGITS, "owner": "bob", "team": "b"})
    assert r.status_code == 422 and {d["field"] for d in r.json()["details"]} >= {"owner", "team"}


def test_revoked_expired_and_disabled_tokens_are_401(world: tuple[ThreadServer, Cast]) -> None:
    server, _ = world
    with server.client(BOOTSTRAP) as boot:
        assert boot.post("/users", json={"name": "carol", "team": "a"}).status_code == 201
        carol = new_token(boot, "carol")
        assert carol.startswith("ty_") and len(carol) > 40
        with server.client(carol) as c:
            assert c.get("/me").json() == {"user": "carol", "team": "a", "role": "member",
                                           "token_id": c.get("/me").json()["token_id"],
                                           "via": "token"}
            token_id = c.get("/me").json()["token_id"]
            listed = c.get("/users/carol/tokens").json()
            assert [t["id"] for t in listed] == [token_id] and "token" not in listed[0]
            assert listed[0]["last_used_at"] is not None or _eventually_used(boot, token_id)
            assert boot.patch("/users/carol", json={"disabled": True}).status_code == 200
            r = c.get("/me")
            assert r.status_code == 401 and "disabled" in r.json()["message"]
            assert 'error="invalid_token"' in r.headers["www-authenticate"]
            assert boot.patch("/users/carol", json={"disabled": False}).status_code == 200
            assert c.get("/me").status_code == 200
            assert c.delete(f"/tokens/{token_id}").status_code == 204  # one's own
            r = c.get("/me")
            assert r.status_code == 401 and "revoked" in r.json()["message"]
        short = new_token(boot, "carol", days=1)
        with server.app.state.session_factory() as session:  # a day later, as the store sees it
            session.execute(_expire_all_of("carol"))
            session.commit()
        with server.client(short) as c:
            r = c.get("/jobs")
            assert r.status_code == 401 and "expired" in r.json()["message"]


def _expire_all_of(user: str):  # type: ignore[no-untyped-def]
    from sqlalchemy import select, update

    from service.store.clock import utcnow
    from service.store.tables import ApiToken, User

    ids = select(User.id).where(User.name == user).scalar_subquery()
    return update(ApiToken).where(ApiToken.user_id == ids).values(expires_at=utcnow())


def _eventually_used(client: httpx.Client, token_id: int) -> bool:
    """last_used_at is written off the request, on a thread of its own."""
    import time

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        tokens = client.get("/users/carol/tokens").json()
        if any(t["id"] == token_id and t["last_used_at"] for t in tokens):
            return True
        time.sleep(0.05)
    return False


def test_only_the_tokens_hash_is_stored(world: tuple[ThreadServer, Cast]) -> None:
    server, cast = world
    from sqlalchemy import text

    with server.app.state.session_factory() as session:
        hashes = session.execute(text("SELECT token_hash FROM api_tokens")).scalars().all()
        dump = "\n".join(session.connection().connection.driver_connection.iterdump())
    assert cast.member not in dump and len(hashes) >= 4
    assert all(re.fullmatch(r"[0-9a-f]{64}", h) for h in hashes)


def test_team_unix_user_is_checked_and_isolation_said(world: tuple[ThreadServer, Cast]) -> None:
    server, _ = world
    with server.client(BOOTSTRAP) as boot:
        for name, why in (("no-such-user-xyz", "is not a user on this host"), ("root", "root")):
            r = boot.patch("/teams/a", json={"unix_user": name})
            assert r.status_code == 422 and r.json()["details"][0]["field"] == "unix_user", r.text
            assert why in r.json()["message"]
        team = boot.get("/teams/a").json()
        assert team["unix_user"] is None and "do not isolate" in team["isolation"]
        assert boot.patch("/teams/a", json={"unix_user": "nobody"}).json()["unix_user"] == "nobody"
        assert boot.patch("/teams/a", json={"unix_user": None}).json()["unix_user"] is None


def test_the_first_personal_token_closes_an_open_server(tmp_path: Path) -> None:
    app = create_app(Settings(home=tmp_path / "home", cpu_slots=2, gpus="none"),
                     run_supervisor=False)
    with serve_in_thread(app) as server, server.client() as anyone:
        assert anyone.get("/me").json() == {"user": "admin", "team": None, "role": "admin",
                                            "token_id": None, "via": "open"}
        assert anyone.post("/users", json={"name": "ops", "role": "admin"}).status_code == 201
        token = new_token(anyone, "ops")
        assert anyone.get("/jobs").status_code == 401  # closed for good
        with server.client(token) as ops:
            assert ops.get("/me").json()["user"] == "ops"


@both_stores
def test_lists_show_only_the_callers_team(tmp_path: Path, database_url: str | None) -> None:
    """The visibility queries on each store: member, viewer, other team, admin, filters, and a
    job from before teams (owner null) that only admins see."""
    app = create_app(_settings(tmp_path / "home", database_url), run_supervisor=False)
    with serve_in_thread(app) as server, server.client(BOOTSTRAP) as boot:
        old = boot.post("/jobs", json=DIGITS).json()["id"]
        with app.state.session_factory() as session:  # as migration 0016 leaves older rows
            from sqlalchemy import text

            session.execute(text("UPDATE jobs SET owner = NULL, team = NULL WHERE id = :i"),
                            {"i": old})
            session.commit()
        cast = make_cast(boot)
        with server.client(cast.member) as alice, server.client(cast.other) as bob:
            mine = alice.post("/jobs", json=DIGITS).json()["id"]
            theirs = bob.post("/jobs", json=DIGITS).json()["id"]
            sweep = alice.post("/sweeps", json=SWEEP).json()["id"]

        def ids(token: str, path: str = "/jobs", **params: str) -> list[int]:
            with server.client(token) as c:
                return [j["id"] for j in c.get(path, params=params).json()["items"]]

        assert ids(cast.member) == ids(cast.viewer) == [mine]
        assert ids(cast.other) == [theirs]
        assert ids(cast.admin) == [theirs, mine, old]
        assert ids(cast.admin, owner="bob") == [theirs] == ids(cast.admin, team="b")
        assert ids(cast.member, team="b") == []
        assert ids(cast.member, "/sweeps") == [sweep] and ids(cast.other, "/sweeps") == []
        with server.client(cast.member) as alice:
            assert alice.get(f"/jobs/{old}").status_code == 404
            progress = alice.get("/progress", params={"job_id": [mine, theirs]}).json()["items"]
            assert [p["last_seq"] for p in progress] == [0, 0]


def test_a_team_whose_unix_user_is_gone_stops_the_server_from_starting(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    settings = _settings(tmp_path / "home")
    app = create_app(settings, run_supervisor=False)
    with TestClient(app) as c:
        headers = {"authorization": f"Bearer {BOOTSTRAP}"}
        assert c.post("/teams", json={"name": "gone", "unix_user": "nobody"},
                      headers=headers).status_code == 201
    with app.state.session_factory() as session:  # as if the host's user were deleted since
        from sqlalchemy import text

        session.execute(text("UPDATE teams SET unix_user = 'ty-deleted-xyz'"))
        session.commit()
    with pytest.raises(ValueError, match="team gone: unix_user 'ty-deleted-xyz'"):
        with TestClient(create_app(settings, run_supervisor=False)):
            pass
