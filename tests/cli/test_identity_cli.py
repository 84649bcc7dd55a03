"""``torchyard team|user|token|whoami|audit`` and the owner and team columns of ``jobs``,
against a real server (no job runs: warm ranks off)."""

from collections.abc import Iterator
from pathlib import Path

import pytest

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
    assert cli(server, "team", "list", env=alice).returncode == 5  # an admin's
    log = cli(server, "audit", "--actor", "alice", env=admin)
    assert log.returncode == 0 and "/jobs" in log.stdout and "403" in log.stdout
    assert cli(server, "user", "disable", "alice", env=admin).returncode == 0
    assert cli(server, "whoami", env=alice).returncode == 5
    assert cli(server, "user", "disable", "alice", "--enable", env=admin).returncode == 0
    assert cli(server, "token", "revoke", "1", env=alice).returncode == 0
    assert cli(server, "whoami", env=alice).returncode == 5
