"""Ids are never handed out twice, on both stores (issue 44, item 4): a deleted job's id is not
the next submission's, so a pipeline's retried ``DELETE /jobs/{id}`` answers 404 rather than
deleting someone else's job; the same for sweeps; and a database upgraded to 0020 keeps it."""

from datetime import datetime
from pathlib import Path

import pytest
from alembic.script import ScriptDirectory
from fastapi.testclient import TestClient
from sqlalchemy import delete, select, text
from sqlalchemy.orm import Session

from service.store import repository as repo
from service.store import sweeps as sweepstore
from service.store.db import alembic_config, make_engine, make_session_factory, upgrade
from service.store.deletion import delete_job_rows
from service.store.tables import Job, Sweep
from tests.conftest import both_stores
from torchyard_contract.spec import JobSpec
from torchyard_contract.state import JobState

pytestmark = both_stores

SPEC = {"dataset": "synthetic", "epochs": 1, "nproc_per_node": 1}
REVISION = "0014_ids_never_reused"


def _submit(api: TestClient, name: str) -> int:
    r = api.post("/jobs", json={**SPEC, "name": name})
    assert r.status_code == 201, r.text
    return r.json()["id"]


def test_a_retried_delete_never_deletes_the_next_submission(api: TestClient) -> None:
    """Pipeline A deletes its (newest) job; B submits; A's DELETE is retried."""
    kept = _submit(api, "older")
    a = _submit(api, "pipeline-a")
    assert api.post(f"/jobs/{a}/cancel").json()["state"] == "cancelled"
    assert api.delete(f"/jobs/{a}").status_code == 204
    b = _submit(api, "pipeline-b")
    assert b > a  # never a's id again
    r = api.delete(f"/jobs/{a}")  # A's retry
    assert r.status_code == 404 and r.json()["error"] == "not_found"
    assert api.get(f"/jobs/{b}").json()["name"] == "pipeline-b"
    assert api.get(f"/jobs/{kept}").status_code == 200
    assert api.get(f"/jobs/{a}").status_code == 404


@pytest.fixture
def url(tmp_path: Path, empty_database_url: str | None) -> str:
    return empty_database_url or f"sqlite:///{tmp_path / 'ids.db'}"


def _new_job(session: Session) -> int:
    job = repo.create_job(session, JobSpec.model_validate(SPEC))
    session.commit()
    return job.id


def _new_sweep(session: Session) -> int:
    sweep = sweepstore.create_sweep(session, "s", 0, {"spec": SPEC})
    session.commit()
    return sweep.id


def _delete_job(session: Session, job_id: int) -> None:
    repo.transition(session, job_id, JobState.cancelled)  # a queued one; an ended one stays
    assert delete_job_rows(session, job_id)
    session.commit()


def _delete_sweep(session: Session, sweep_id: int) -> None:
    """No route deletes a sweep today; an operator's or a later route's delete must still
    leave its id spent."""
    session.execute(delete(Sweep).where(Sweep.id == sweep_id))
    session.commit()


def _assert_ids_not_reused(url: str) -> None:
    engine = make_engine(url)
    sessions = make_session_factory(engine)
    try:
        with sessions() as s:
            jobs = [_new_job(s) for _ in range(3)]
            sweeps = [_new_sweep(s) for _ in range(2)]
            _delete_job(s, jobs[-1])  # the newest: the one a plain rowid table hands out again
            _delete_sweep(s, sweeps[-1])
            assert _new_job(s) > jobs[-1]
            assert _new_sweep(s) > sweeps[-1]
    finally:
        engine.dispose()


def test_a_fresh_database_never_reuses_job_or_sweep_ids(url: str) -> None:
    upgrade(url)
    _assert_ids_not_reused(url)


def test_a_database_upgraded_to_0014_never_reuses_ids(url: str) -> None:
    """Rows written before the upgrade keep their ids, later ones come after the largest."""
    previous = ScriptDirectory.from_config(alembic_config(url)).get_revision(REVISION).down_revision
    assert isinstance(previous, str)
    upgrade(url, previous)
    engine = make_engine(url)
    with engine.begin() as conn:
        for name in ("one", "two", "three"):
            conn.execute(text(
                "INSERT INTO jobs (name, state, spec, created_at, priority)"
                " VALUES (:name, 'succeeded', '{}', :at, 0)"), {"name": name, "at": datetime(2026, 1, 1)})
        conn.execute(text(
            "INSERT INTO metric_records (job_id, attempt, rank, epoch, step, name, value, time)"
            " SELECT id, 1, 0, 0, -1, 'loss', 0.5, 1.0 FROM jobs"))
        for webhook_id in ("msg_1", "msg_2"):  # the newest deleted: its id is spent too
            conn.execute(text(
                "INSERT INTO webhook_deliveries (job_id, endpoint, event, webhook_id, body,"
                " created_at, state, attempts, next_attempt_at) SELECT min(id), 'ci', 'running',"
                " :w, '{}', :at, 'delivered', 1, :at FROM jobs"),
                {"w": webhook_id, "at": datetime(2026, 1, 1)})
        conn.execute(text("DELETE FROM webhook_deliveries WHERE webhook_id = 'msg_2'"))
    engine.dispose()
    upgrade(url, REVISION)
    engine = make_engine(url)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT name FROM jobs ORDER BY id")).scalars().all() == [
            "one", "two", "three"]
        assert conn.execute(text("SELECT count(*) FROM metric_records")).scalar() == 3
        conn.execute(text(
            "INSERT INTO webhook_deliveries (job_id, endpoint, event, webhook_id, body,"
            " created_at, state, attempts, next_attempt_at)"
            " VALUES (1, 'ci', 'succeeded', 'msg_3', '{}', :at, 'pending', 0, :at)"),
            {"at": datetime(2026, 1, 1)})
        assert conn.execute(text("SELECT id FROM webhook_deliveries ORDER BY id")).scalars(
            ).all() == [1, 3]
        conn.commit()
    engine.dispose()
    upgrade(url)  # the later revisions (the ORM's columns) keep the counter
    engine = make_engine(url)
    with make_session_factory(engine)() as s:
        newest = max(s.scalars(select(Job.id)))
        _delete_job(s, newest)
        assert _new_job(s) == newest + 1
    engine.dispose()
    upgrade(url)
    _assert_ids_not_reused(url)
