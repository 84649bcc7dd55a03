"""Teams on a real server with real jobs: who holds the box is everyone's to see, another team's
job is not (and cancelling it is refused and audited), secrets are granted to teams, packages
are the uploading team's, and a sweep's trials are its team's.

One module-scoped server (subprocess, SQLite, warm ranks, a script directory and a secrets file
with per-team grants); the cast is made through its API with the bootstrap token.
"""

import hashlib
import io
import json
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import LiveServer, _copy_sqlite, _start_server, _stop_server
from tests.security.people import BOOTSTRAP, Cast, make_cast

SLEEPER = "import time\ntime.sleep(120)\n"
SECRET_CHECK = "import os, sys\nsys.exit(0 if os.environ.get('X') == 'a-value' else 3)\n"
SECRETS = {"shared": "s-value", "a-only": {"value": "a-value", "teams": ["a"]},
           "b-only": {"value": "b-value", "teams": ["b"]}}


@pytest.fixture(scope="module")
def world(
    tmp_path_factory: pytest.TempPathFactory, _migrated_sqlite: Path,
) -> Iterator[tuple[LiveServer, Cast]]:
    root = tmp_path_factory.mktemp("teams")
    (root / "scripts").mkdir()
    (root / "scripts" / "sleeper.py").write_text(SLEEPER)
    (root / "scripts" / "secretcheck.py").write_text(SECRET_CHECK)
    (root / "secrets.json").write_text(json.dumps(SECRETS))
    _copy_sqlite(_migrated_sqlite, root / "home")
    server = _start_server(root / "home", {
        "TORCHYARD_API_TOKENS": BOOTSTRAP, "TORCHYARD_SCRIPT_DIRS": str(root / "scripts"),
        "TORCHYARD_SECRETS_FILE": str(root / "secrets.json"),
    })
    try:
        with server.client() as boot:
            cast = make_cast(boot)
        yield server, cast
    finally:
        _stop_server(server)


def _as(server: LiveServer, token: str):  # type: ignore[no-untyped-def]
    client = server.client()
    client.headers["authorization"] = f"Bearer {token}"
    return client


def test_resources_show_every_holder_and_a_denied_cancel_is_audited(
    world: tuple[LiveServer, Cast],
) -> None:
    server, cast = world
    with _as(server, cast.member) as alice, _as(server, cast.other) as bob, \
            _as(server, cast.viewer) as vic, _as(server, cast.admin) as admin:
        job = alice.post("/jobs", json={"name": "holder", "entrypoint": "sleeper.py"}).json()
        server.wait_for(job["id"], {"starting", "running"})  # its slot is held from starting
        held = [i for i in bob.get("/resources").json()["items"] if i["job_id"] == job["id"]]
        assert held and all((i["job_name"], i["owner"], i["team"]) == ("holder", "alice", "a")
                            for i in held)
        assert bob.get(f"/jobs/{job['id']}").status_code == 404
        after = admin.get("/audit", params={"limit": 1000}).json()["next_after"]
        assert vic.post(f"/jobs/{job['id']}/cancel").status_code == 403
        assert bob.post(f"/jobs/{job['id']}/cancel").status_code == 404
        assert alice.get(f"/jobs/{job['id']}").json()["state"] in ("starting", "running")
        entries = admin.get("/audit", params={"after": after}).json()["items"]
        seen = {(e["actor"], e["method"], e["route"], e["target"], e["status"]) for e in entries}
        assert ("vic", "POST", "/jobs/{job_id}/cancel", f"job {job['id']}", 403) in seen
        assert ("bob", "POST", "/jobs/{job_id}/cancel", f"job {job['id']}", 404) in seen
        vics = admin.get("/audit", params={"after": after, "actor": "vic"}).json()["items"]
        assert vics and all(e["actor"] == "vic" and e["token_id"] for e in vics)
        assert vics[0]["client"] == "127.0.0.1" and vics[0]["via"] == "token"
        assert vic.get("/audit").status_code == 403
        assert alice.post(f"/jobs/{job['id']}/cancel").json()["state"] == "cancelled"
        text = json.dumps(admin.get("/audit", params={"limit": 1000}).json())
        assert all(t not in text for t in (cast.member, cast.viewer, cast.other, BOOTSTRAP))


def test_secrets_are_granted_to_teams(world: tuple[LiveServer, Cast]) -> None:
    server, cast = world
    with _as(server, cast.member) as alice:
        refused = alice.post("/jobs", json={"entrypoint": "secretcheck.py",
                                            "secret_env": {"X": "b-only"}})
        assert refused.status_code == 422, refused.text
        message = refused.json()["message"]
        assert message.startswith("secret_env:") and "a-only, shared" in message
        assert "b-only'" in message and "b-only," not in message.split("may use:")[1]
        job = alice.post("/jobs", json={"entrypoint": "secretcheck.py",
                                        "secret_env": {"X": "a-only"}}).json()
    assert server.wait_for(job["id"], {"succeeded"}, allowed={"queued", "starting", "running"})


def _zip() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("main.py", "print('team package')\n")
    return buffer.getvalue()


def test_packages_are_the_uploading_teams(world: tuple[LiveServer, Cast]) -> None:
    server, cast = world
    body = _zip()
    digest = "sha256:" + hashlib.sha256(body).hexdigest()
    binary = {"content-type": "application/octet-stream"}
    with _as(server, cast.member) as alice, _as(server, cast.other) as bob:
        assert alice.post("/packages", content=body, headers=binary).status_code == 201
        assert alice.head(f"/packages/{digest}").status_code == 200
        hidden = bob.get(f"/packages/{digest}")
        missing = bob.get("/packages/sha256:" + "1" * 64)
        assert hidden.status_code == missing.status_code == 404
        assert hidden.json()["message"] == missing.json()["message"].replace("1" * 64, digest[7:])
        assert bob.head(f"/packages/{digest}").status_code == 404
        spec = {"entrypoint": "main.py", "package": digest}
        refused = bob.post("/jobs", json=spec)
        assert refused.status_code == 422 and "package" in refused.json()["message"]
        assert bob.post("/packages", content=body, headers=binary).status_code == 201  # new to b
        assert bob.head(f"/packages/{digest}").status_code == 200
        assert bob.post("/jobs", json=spec).status_code == 201
        assert alice.post("/packages", content=body, headers=binary).status_code == 200
    assert len(list((server.home / "packages" / "sha256").iterdir())) == 1  # stored once


def test_a_sweeps_trials_are_its_team_and_owners(world: tuple[LiveServer, Cast]) -> None:
    server, cast = world
    sweep_spec = {"name": "t", "spec": {"entrypoint": "secretcheck.py",
                                         "secret_env": {"X": "a-only"}},
                  "space": {"x": {"type": "choice", "values": [1]}}, "max_trials": 1}
    with _as(server, cast.member) as alice, _as(server, cast.other) as bob:
        sweep = alice.post("/sweeps", json=sweep_spec).json()
        assert (sweep["owner"], sweep["team"]) == ("alice", "a")
        assert bob.get(f"/sweeps/{sweep['id']}").status_code == 404
        trials = []
        for _ in range(600):  # the driver makes the trial on its next pass
            trials = alice.get(f"/sweeps/{sweep['id']}").json()["trials"]
            if trials:
                break
            import time

            time.sleep(0.1)
        assert trials, "no trial made"
        job = alice.get(f"/jobs/{trials[0]['job_id']}").json()
        assert (job["owner"], job["team"]) == ("alice", "a")
    assert server.wait_for(job["id"], {"succeeded"})["state"] == "succeeded"
