"""A database URL is never printed with its password (issue 23, finding 8)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from service.store.db import masked_url
from tests import pgserver
from tests.conftest import REPO_ROOT

PASSWORD = "pw-that-must-not-show-0123456789"


def _db_upgrade(home: Path, url: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TORCHYARD_HOME": str(home), "TORCHYARD_DATABASE_URL": url}
    return subprocess.run(
        [sys.executable, "-m", "service", "db", "upgrade"], env=env, cwd=REPO_ROOT,
        capture_output=True, text=True, timeout=120,
    )


def test_db_upgrade_prints_the_postgres_url_without_its_password(
    postgres_server: pgserver.PgServer, tmp_path: Path
) -> None:
    # The test server trusts every local connection, so any password is accepted (and unused).
    url = postgres_server.create_database().replace("//postgres@", f"//postgres:{PASSWORD}@")
    done = _db_upgrade(tmp_path / "home", url)
    assert done.returncode == 0, done.stderr
    assert PASSWORD not in done.stdout + done.stderr
    host = url.split("@", 1)[1]
    assert f"database at postgresql+psycopg://postgres:***@{host} is at head" in done.stdout


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (f"postgresql+psycopg://u:{PASSWORD}@db:5432/x", "postgresql+psycopg://u:***@db:5432/x"),
        ("postgresql+psycopg://u:p%40ss%3Aword@db/x", "postgresql+psycopg://u:***@db/x"),
        ("sqlite:////srv/torchyard/torchyard.db", "sqlite:////srv/torchyard/torchyard.db"),
        ("postgresql://u@db/x", "postgresql://u@db/x"),
        (f"no-such-scheme://u:{PASSWORD}@db/x", "no-such-scheme://u:***@db/x"),
    ],
)
def test_masked_url_hides_only_the_password(url: str, shown: str) -> None:
    assert masked_url(url) == shown
