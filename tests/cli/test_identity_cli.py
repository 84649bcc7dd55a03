"""``torchyard team|user|token|whoami|audit|usage`` and the owner and team columns of ``jobs``,
against a real server (no job runs: warm ranks off)."""

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from service.store import usage
from service.store.db import make_engine, make_session_factory
from tests.conftest import LiveServer, _copy_sqlite, _start_server, _stop_server, cli

BOOTSTRAP = "bootstrap-token-for-the-cli-tests-0123"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, _migrated_sqlite: Path) -> Iterator[LiveServer]:
    home = tmp_path_factory.mktemp("identity-cli") / "home"
    _copy_sqlite(_migrated_sqlite, home)
    running = _start_server(home, {"TORCHYARD_API_TOKENS": BOOTSTRAP,
                                   "TORCHYARD_WARM_RANKS": "false"})
    yield running
    _stop_server(running)


def test_team_user_token_whoami_and_audit(server: LiveServer) -> None:
    admin = {"TORCHYARD_TOKEN": BOOTSTRAP}
    made = cli(server, "team", "add", "vision", env=admin)
    assert made.returncode == 0 and "team vision created" in made.stdout
    assert "do not isolate" in made.stdout
    assert "vision" in cli(server, "team", "list", env=admin).stdout
    made = cli(server, "user", "add", "alice", "--team", "vision", "--role", "member", env=admin)
    assert made.returncode == 0, made.stderr
    refused = cli(server, "user", "add", "vic", "--role", "viewer", env=admin)
    assert refused.returncode == 5 and "team" in refused.stderr
    token = cli(server, "token", "create", "laptop", "--user", "alice", env=admin)
    assert token.returncode == 0 and token.stdout.strip().startswith("ty_"), token.stderr
    alice = {"TORCHYARD_TOKEN": token.stdout.strip()}
    whoami = cli(server, "whoami", env=alice)
    assert "alice (member, team vision, via token, token 1)" in whoami.stdout, whoami.stdout
    listed = cli(server, "token", "list", env=alice).stdout
    assert "laptop" in listed and token.stdout.strip() not in listed
    submitted = cli(server, "submit", "--name", "mine", "--dataset", "digits", env=alice)
    assert submitted.returncode == 0, submitted.stderr
    jobs = cli(server, "jobs", "--owner", "alice", env=admin).stdout
    assert "alice" in jobs and "vision" in jobs and "mine" in jobs
    assert "alice" in cli(server, "user", "list", env=admin).stdout
    mine = cli(server, "team", "list", env=alice)  # their own team only
    assert mine.returncode == 0 and "vision" in mine.stdout, mine.stderr
    assert cli(server, "user", "list", env=alice).returncode == 5  # an admin's
    log = cli(server, "audit", "--actor", "alice", env=admin)
    assert log.returncode == 0 and "/jobs" in log.stdout and "403" in log.stdout
    assert cli(server, "user", "disable", "alice", env=admin).returncode == 0
    assert cli(server, "whoami", env=alice).returncode == 5
    assert cli(server, "user", "disable", "alice", "--enable", env=admin).returncode == 0
    assert cli(server, "token", "revoke", "1", env=alice).returncode == 0
    assert cli(server, "whoami", env=alice).returncode == 5


def test_team_set_and_usage(server: LiveServer) -> None:
    admin = {"TORCHYARD_TOKEN": BOOTSTRAP}
    assert cli(server, "team", "add", "nlp", env=admin).returncode == 0
    spent = cli(server, "team", "set", "nlp", "--slot-hours", "0", env=admin)  # nothing starts
    assert spent.returncode == 0 and "budget spent" in spent.stdout, spent.stdout
    job_id = _job_of_team(server, "nlp", "nora")
    made = cli(server, "team", "set", "nlp", "--max-slots", "2", "--slot-hours", "100",
               "--share", "2", env=admin)
    assert made.returncode == 0 and "100.0 /month" in made.stdout, made.stdout + made.stderr
    made = cli(server, "team", "set", "nlp", "--period", "rolling_30d", env=admin)
    assert "100.0 /rolling_30d" in made.stdout, made.stdout  # the quota's other fields stay
    refused = cli(server, "team", "set", "nlp", "--period", "weekly", env=admin)
    assert refused.returncode == 5 and "quota.period" in refused.stderr
    now = time.time()
    engine = make_engine(f"sqlite:///{server.home / 'torchyard.db'}")
    with make_session_factory(engine)() as session:
        usage.open_run(session, job_id, 2, now - 3600)
        usage.close_runs(session, job_id, now)  # 2 slots × 1 h, as the server would close it
        session.commit()
    engine.dispose()
    table = cli(server, "usage", "--by", "user", "--since", "2026-01-01", env=admin)
    assert table.returncode == 0 and "nora" in table.stdout and "2.00" in table.stdout, table.stdout
    text = cli(server, "usage", "--by", "job", "--csv", env=admin).stdout.splitlines()
    assert text[0] == "team,user,job_id,slot_seconds,jobs,attempts"
    assert f"nlp,nora,{job_id},7200.0,1,1" in text
    listed = cli(server, "team", "list", env=admin).stdout
    assert "nlp" in listed and "2.00" in listed


def _job_of_team(server: LiveServer, team: str, user: str) -> int:
    """A job of ``user`` in ``team``, submitted as them and cancelled while its team's spent
    budget holds it: it never ran."""
    admin = {"TORCHYARD_TOKEN": BOOTSTRAP}
    assert cli(server, "user", "add", user, "--team", team, env=admin).returncode == 0
    token = cli(server, "token", "create", "t", "--user", user, env=admin).stdout.strip()
    with server.client() as c:
        c.headers["authorization"] = f"Bearer {token}"
        r = c.post("/jobs", json={"name": "u", "dataset": "digits", "epochs": 1})
        assert r.status_code == 201, r.text
        job_id = r.json()["id"]
        assert c.post(f"/jobs/{job_id}/cancel").json()["started_at"] is None
    return job_id
