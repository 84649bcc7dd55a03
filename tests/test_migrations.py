"""The schema comes only from Alembic, and the ORM models agree with its head."""

from __future__ import annotations

from pathlib import Path

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect

from service.db import make_engine, upgrade
from service.models import Base


def test_upgrade_from_empty_creates_tables(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'a.db'}"
    upgrade(url)
    engine = make_engine(url)
    names = set(inspect(engine).get_table_names())
    assert {"jobs", "metric_records", "allocations", "alembic_version"} <= names
    with engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
    engine.dispose()


def test_models_match_migration_head(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'b.db'}"
    upgrade(url)
    engine = make_engine(url)
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    engine.dispose()
    assert diff == []


def test_upgrade_twice_is_a_noop(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'c.db'}"
    upgrade(url)
    upgrade(url)
