"""The schema comes only from Alembic, and the ORM models agree with its head, on both stores."""

import json
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, inspect, select, text
from sqlalchemy.orm import Session

from service.executor.reference import attempt_loop_pid, decode_reference, encode_reference
from service.store.db import alembic_config, head_revision, is_at_head, make_engine, upgrade
from service.store.tables import Base, Job
from tests.conftest import both_stores


@pytest.fixture
def url(tmp_path: Path, empty_database_url: str | None) -> str:
    return empty_database_url or f"sqlite:///{tmp_path / 'a.db'}"


def _revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


@both_stores
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


def test_each_revision_is_named_by_its_file_and_they_apply_in_name_order() -> None:
    """What ``head_revision`` (the start-up's check that nothing needs migrating) relies on: a
    file's name starts with its revision (0001–0009 are the number alone; from 0010 on, and for
    every new one, the whole name), and names sort in the order the revisions apply."""
    script = ScriptDirectory.from_config(alembic_config("sqlite://"))
    chain = list(reversed(list(script.walk_revisions())))  # base first
    stems = [Path(rev.path).stem for rev in chain]
    assert all(stem == rev.revision or stem.startswith(f"{rev.revision}_")
               for stem, rev in zip(stems, chain, strict=True)), stems
    assert stems == sorted(stems)
    assert head_revision() == script.get_current_head() == chain[-1].revision == stems[-1]


@both_stores
def test_a_database_one_revision_behind_is_not_at_head(url: str) -> None:
    script = ScriptDirectory.from_config(alembic_config(url))
    previous = script.get_revision(script.get_current_head()).down_revision
    assert isinstance(previous, str)
    assert not is_at_head(url)  # nothing there yet
    upgrade(url, previous)
    assert not is_at_head(url)
    upgrade(url)
    assert is_at_head(url)


@both_stores
def test_upgrade_from_the_previous_head_keeps_rows(url: str) -> None:
    script = ScriptDirectory.from_config(alembic_config(url))
    head = script.get_revision(script.get_current_head())
    previous = head.down_revision
    assert isinstance(previous, str)
    upgrade(url, previous)
    engine = make_engine(url)
    assert _revision(engine) == previous
    with engine.begin() as conn:
        for name, state in (("old", "succeeded"), ("live", "running")):
            conn.execute(text(
                "INSERT INTO jobs (name, state, spec, created_at, priority)"
                f" VALUES ('{name}', '{state}', '{{}}', '2026-01-01 00:00:00', 0)"
            ))
    upgrade(url)
    assert _revision(engine) == head.revision
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT name, state, exclude_nodes FROM jobs ORDER BY id")).all()
    # 0013_exclude_nodes: no job excludes a node until a retry_elsewhere rule restarts it.
    assert rows == [("old", "succeeded", None), ("live", "running", None)]
    engine.dispose()


@both_stores
def test_0012_counts_the_state_changes_the_state_implies(url: str) -> None:
    upgrade(url, "0011_sweeps")
    engine = make_engine(url)
    with engine.begin() as conn:
        for name, state in (("old", "succeeded"), ("live", "running")):
            conn.execute(text(
                "INSERT INTO jobs (name, state, spec, created_at, priority)"
                f" VALUES ('{name}', '{state}', '{{}}', '2026-01-01 00:00:00', 0)"
            ))
    upgrade(url)
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT name, state, state_changes, pauses FROM jobs"
                                 " ORDER BY id")).all()
    # 0012_pause: the count of state changes the state implies (the event stream's cursor).
    assert rows == [("old", "succeeded", 3, 0), ("live", "running", 2, 0)]
    engine.dispose()


@both_stores
def test_0013_keeps_a_jobs_excluded_nodes_and_downgrades(url: str) -> None:
    upgrade(url)
    engine = make_engine(url)
    with engine.begin() as conn:
        conn.execute(text(
            "INSERT INTO jobs (name, state, spec, created_at, priority, exclude_nodes)"
            " VALUES ('requeued', 'queued', '{}', '2026-01-01 00:00:00', 0, :nodes)"
        ), {"nodes": json.dumps(["n2", "gpu-07"])})
    with Session(engine) as session:
        [job] = session.scalars(select(Job)).all()
        assert job.exclude_nodes == ["n2", "gpu-07"]
    engine.dispose()
    command.downgrade(alembic_config(url), "0012_pause")
    engine = make_engine(url)
    with engine.connect() as conn:
        columns = {c["name"] for c in inspect(conn).get_columns("jobs")}
        assert conn.execute(text("SELECT name FROM jobs")).scalars().all() == ["requeued"]
    engine.dispose()
    assert "exclude_nodes" not in columns and "pauses" in columns


@both_stores
def test_0015_records_each_existing_trial_of_its_sweep(url: str) -> None:
    """Each sweep's trials (jobs with its ``sweep_id``), numbered in the order they were made,
    with their parameters; a job that is no trial gets no row; the downgrade drops the table."""
    upgrade(url, "0013_exclude_nodes")
    engine = make_engine(url)
    with engine.begin() as conn:
        for sweep_id in (1, 2):
            conn.execute(text(
                "INSERT INTO sweeps (id, name, state, priority, spec, created_at)"
                f" VALUES ({sweep_id}, 's', 'running', 0, '{{}}', '2026-01-01 00:00:00')"))
        for job_id, sweep_id, params in ((3, 2, '{"x": 1}'), (5, 1, '{"x": 2}'),
                                         (6, None, None), (7, 2, '{"x": 3}')):
            conn.execute(text(
                "INSERT INTO jobs (id, name, state, priority, spec, created_at, sweep_id, params)"
                " VALUES (:id, 't', 'succeeded', 0, '{}', '2026-01-01 00:00:00', :sweep, :params)"
            ), {"id": job_id, "sweep": sweep_id, "params": params})
    engine.dispose()
    upgrade(url)
    engine = make_engine(url)
    with engine.connect() as conn:
        rows = conn.execute(text(
            "SELECT sweep_id, number, job_id, params, outcome, state FROM sweep_trials"
            " ORDER BY sweep_id, number")).all()
    engine.dispose()
    loaded = [(*r[:3], r[3] if isinstance(r[3], dict) else json.loads(r[3]), *r[4:])
              for r in rows]
    assert loaded == [(1, 1, 5, {"x": 2}, None, None), (2, 1, 3, {"x": 1}, None, None),
                      (2, 2, 7, {"x": 3}, None, None)]
    command.downgrade(alembic_config(url), "0013_exclude_nodes")
    engine = make_engine(url)
    assert "sweep_trials" not in inspect(engine).get_table_names()
    engine.dispose()


@both_stores
def test_0016_leaves_existing_jobs_and_sweeps_ownerless_and_downgrades(url: str) -> None:
    """Rows from before the identity migration get owner and team null (admins only see
    them); the new tables' ids are never reused on SQLite (AUTOINCREMENT); down again keeps
    the jobs."""
    upgrade(url, "0015_sweep_record")
    engine = make_engine(url)
    with engine.begin() as conn:
        conn.execute(text(
            "INSERT INTO jobs (name, state, spec, created_at, priority)"
            " VALUES ('before', 'succeeded', '{}', '2026-01-01 00:00:00', 0)"))
        conn.execute(text(
            "INSERT INTO sweeps (name, state, spec, created_at, priority)"
            " VALUES ('old-sweep', 'running', '{}', '2026-01-01 00:00:00', 0)"))
    engine.dispose()
    upgrade(url)
    engine = make_engine(url)
    with engine.begin() as conn:
        assert conn.execute(text("SELECT name, owner, team FROM jobs")).all() == [
            ("before", None, None)]
        assert conn.execute(text("SELECT owner, team FROM sweeps")).all() == [(None, None)]
        conn.execute(text("INSERT INTO teams (name, created_at) VALUES ('a', '2026-01-01')"))
        conn.execute(text("DELETE FROM teams"))
        conn.execute(text("INSERT INTO teams (name, created_at) VALUES ('b', '2026-01-01')"))
        assert conn.execute(text("SELECT id FROM teams")).scalars().all() == [2]
    engine.dispose()
    command.downgrade(alembic_config(url), "0015_sweep_record")
    engine = make_engine(url)
    with engine.connect() as conn:
        columns = {c["name"] for c in inspect(conn).get_columns("jobs")}
        assert conn.execute(text("SELECT name FROM jobs")).scalars().all() == ["before"]
        assert "teams" not in inspect(conn).get_table_names()
    engine.dispose()
    assert "owner" not in columns and "exclude_nodes" in columns


@both_stores
def test_models_match_migration_head(url: str) -> None:
    upgrade(url)
    engine = make_engine(url)
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    engine.dispose()
    assert diff == []


@both_stores
def test_upgrade_twice_is_a_noop(url: str) -> None:
    """A second upgrade (every server start runs one) changes neither the schema nor a row."""
    upgrade(url)
    engine = make_engine(url)
    with engine.begin() as conn:
        conn.execute(text(
            "INSERT INTO jobs (name, state, priority, spec, created_at)"
            " VALUES ('kept', 'queued', 0, '{}', '2026-01-01 00:00:00')"))
    schema = _schema(engine)
    engine.dispose()

    upgrade(url)
    engine = make_engine(url)
    assert _schema(engine) == schema
    with engine.connect() as conn:
        assert conn.execute(text("SELECT name FROM jobs")).scalars().all() == ["kept"]
        head = conn.execute(text("SELECT version_num FROM alembic_version")).scalars().all()
    engine.dispose()
    assert head == [ScriptDirectory.from_config(alembic_config(url)).get_current_head()]


def _schema(engine: Engine) -> dict[str, list[tuple[str, str, bool]]]:
    """Every table's columns (name, type, nullable), as the store reports them."""
    inspector = inspect(engine)
    return {
        table: [(c["name"], str(c["type"]), c["nullable"]) for c in inspector.get_columns(table)]
        for table in sorted(inspector.get_table_names())
    }


@both_stores
def test_0005_turns_a_pid_into_the_local_executors_reference(url: str) -> None:
    """A job launched before 0005 keeps its process: the reference the local executor adopts
    from is made of its pid and start time, and its metric records survive the migration."""
    upgrade(url, "0004")
    engine = make_engine(url)
    with engine.begin() as conn:
        conn.execute(text(
            "INSERT INTO jobs (id, name, state, priority, spec, created_at, pid, pid_create_time)"
            " VALUES (1, 'old', 'running', 0, '{}', '2026-12-01 00:00:00', 4242, 1700000000.25),"
            " (2, 'queued', 'queued', 0, '{}', '2026-12-01 00:00:00', NULL, NULL)"
        ))
        conn.execute(text(
            "INSERT INTO metric_records (job_id, attempt, rank, epoch, step, name, value, time)"
            " VALUES (1, 1, 0, 0, -1, 'loss', 0.5, 1.0)"
        ))
    engine.dispose()
    upgrade(url)
    engine = make_engine(url)
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT id, executor, executor_ref FROM jobs ORDER BY id")).all()
        records = conn.execute(text("SELECT count(*) FROM metric_records")).scalar()
        columns = {c["name"] for c in inspect(conn).get_columns("jobs")}
    engine.dispose()
    assert rows[1] == (2, None, None)
    assert rows[0][1] == "local"
    assert decode_reference(rows[0][2]) == (4242, 1700000000.25, None)
    assert attempt_loop_pid(rows[0][1], rows[0][2]) == 4242
    assert records == 1
    assert not columns & {"pid", "pid_create_time"}


@both_stores
def test_0005_downgrade_restores_the_pid(url: str) -> None:
    upgrade(url)
    engine = make_engine(url)
    with engine.begin() as conn:
        conn.execute(text(
            "INSERT INTO jobs (id, name, state, priority, spec, created_at, executor, executor_ref)"
            " VALUES (1, 'j', 'running', 0, '{}', '2026-12-01 00:00:00', 'local', :ref)"
        ), {"ref": encode_reference(77, 5.5)})
    engine.dispose()
    command.downgrade(alembic_config(url), "0004")
    engine = make_engine(url)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT pid, pid_create_time FROM jobs")).one() == (77, 5.5)
    engine.dispose()


def test_upgrading_a_populated_database_keeps_every_child_row(tmp_path: Path) -> None:
    """0003 rebuilds ``jobs`` (SQLite batch mode): with foreign keys on, that DROP used to
    cascade into every job's records. Upgrading from 0002 with data must keep all of it."""
    url = f"sqlite:///{tmp_path / 'f.db'}"
    upgrade(url, "0002")
    engine = make_engine(url)
    with engine.begin() as conn:
        conn.execute(text(
            "INSERT INTO jobs (id, name, state, spec, created_at, pid, pid_create_time)"
            " VALUES (1, 'old', 'succeeded', '{}', '2026-12-01 00:00:00', NULL, NULL)"
        ))
        conn.execute(text(
            "INSERT INTO metric_records (job_id, attempt, rank, epoch, step, name, value, time)"
            " VALUES (1, 1, 0, 0, -1, 'loss', 0.5, 1.0), (1, 1, 1, 0, -1, 'loss', 0.25, 1.0)"
        ))
    engine.dispose()
    upgrade(url)
    engine = make_engine(url)
    with engine.connect() as conn:
        records = conn.execute(text("SELECT count(*) FROM metric_records")).scalar()
        jobs = conn.execute(text("SELECT count(*) FROM jobs")).scalar()
        foreign_keys = conn.exec_driver_sql("PRAGMA foreign_keys").scalar()
    engine.dispose()
    assert (jobs, records) == (1, 2)
    assert foreign_keys == 1
