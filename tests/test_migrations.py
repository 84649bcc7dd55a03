"""The schema comes only from Alembic, and the ORM models agree with its head, on both stores."""

from __future__ import annotations

from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, inspect, text

from service.db import alembic_config, make_engine, upgrade
from service.models import Base
from tests.conftest import both_stores

pytestmark = both_stores


@pytest.fixture
def url(tmp_path: Path, database_url: str | None) -> str:
    return database_url or f"sqlite:///{tmp_path / 'a.db'}"


def _revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def test_upgrade_from_empty_creates_tables(url: str, store: str) -> None:
    upgrade(url)
    engine = make_engine(url)
    names = set(inspect(engine).get_table_names())
    assert {"jobs", "metric_records", "allocations", "alembic_version"} <= names
    with engine.connect() as conn:
        if store == "sqlite":
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
        else:
            assert conn.execute(text("SHOW transaction_isolation")).scalar() == "read committed"
    engine.dispose()


def test_upgrade_from_the_previous_head_keeps_rows(url: str) -> None:
    script = ScriptDirectory.from_config(alembic_config(url))
    head = script.get_revision(script.get_current_head())
    previous = head.down_revision
    assert isinstance(previous, str)
    upgrade(url, previous)
    engine = make_engine(url)
    assert _revision(engine) == previous
    with engine.begin() as conn:
        conn.execute(text(
            "INSERT INTO jobs (name, state, spec, created_at, priority)"
            " VALUES ('old', 'succeeded', '{}', '2026-01-01 00:00:00', 0)"
        ))
    upgrade(url)
    assert _revision(engine) == head.revision
    with engine.connect() as conn:
        assert conn.execute(text("SELECT name, state FROM jobs")).all() == [("old", "succeeded")]
    engine.dispose()


def test_models_match_migration_head(url: str) -> None:
    upgrade(url)
    engine = make_engine(url)
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    engine.dispose()
    assert diff == []


def test_upgrade_twice_is_a_noop(url: str) -> None:
    upgrade(url)
    upgrade(url)
