"""Clean-up (issue 24, item 5): DELETE /jobs/{id}, retention, unused packages, the disk floor.

A deleted job leaves no row in any table, no record, no file (checked on both stores); a live
job is 409; deleting again is 404. Retention deletes old terminal jobs in the background. Below
the free-space floor new jobs and uploads get 507, and /healthz and Prometheus say how much is
free.
"""

import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Connection, create_engine, text

from service.app import create_app
from service.domain.files.cleanup import RECORD_BATCH, Cleanup, JobLive, JobNotFound
from service.domain.files.packages import PackageStore
from service.domain.files.unpack import Limits
from service.settings import Settings
from service.store import records as recordstore
from service.store import repository as repo
from service.store.db import make_engine, make_session_factory, upgrade
from service.store.records import RecordIn
from service.store.tables import Base
from tests.conftest import LiveServer, both_stores
from torchyard_contract.spec import JobSpec
from torchyard_contract.state import JobState

JOB = {"dataset": "synthetic", "epochs": 1, "synthetic_samples": 64, "labels": {"t": "del"}}


def _counts(conn: Connection, job_id: int) -> dict[str, int]:
    """Rows that mention the job in every table that has a job id."""
    counts = {}
    for table in Base.metadata.sorted_tables:
        column = "id" if table.name == "jobs" else "job_id"
        if column in table.c:
            counts[table.name] = conn.execute(
                text(f"SELECT count(*) FROM {table.name} WHERE {column} = :j"), {"j": job_id}
            ).scalar_one()
    return counts


def _rows_of(server: LiveServer, database_url: str | None, job_id: int) -> dict[str, int]:
    url = database_url or f"sqlite:///{server.home / 'torchyard.db'}"
    engine = create_engine(url)
    with engine.connect() as conn:
        counts = _counts(conn, job_id)
    engine.dispose()
    return counts


def test_delete_removes_everything(shared_server: LiveServer) -> None:
    """The live path, on the shared server (SQLite); the same statements on both stores are
    ``test_deleting_a_terminal_job_empties_every_table_it_owns``."""
    server = shared_server
    with server.client() as c:
        job_id = c.post("/jobs", json=JOB).json()["id"]
        live = c.delete(f"/jobs/{job_id}")
        assert live.status_code == 409 and "cancel it first" in live.json()["message"], live.text
        server.wait_for(job_id, {"succeeded"})
        run = server.home / "runs" / str(job_id)
        assert (run / "logs").is_dir() and (run / "outputs").is_dir()
        rows = _rows_of(server, None, job_id)
        assert rows["jobs"] == 1 and rows["metric_records"] > 0 and rows["job_labels"] == 1
        r = c.delete(f"/jobs/{job_id}")
        assert r.status_code == 204 and r.content == b""
        assert c.delete(f"/jobs/{job_id}").status_code == 404
        assert c.get(f"/jobs/{job_id}").status_code == 404
        assert c.get(f"/jobs/{job_id}/metrics").status_code == 404
        labelled = c.get("/jobs", params={"label": "t=del"}).json()["items"]
        assert job_id not in [j["id"] for j in labelled]
    assert set(_rows_of(server, None, job_id).values()) == {0}
    assert not run.exists()
    assert not [p for p in (server.home / "runs").iterdir() if str(job_id) in p.name]


@both_stores
def test_deleting_a_terminal_job_empties_every_table_it_owns(
    tmp_path: Path, database_url: str | None
) -> None:
    """``Cleanup.delete`` as each store runs it: the records in batches (a ``LIMIT`` inside
    ``IN``), then every job-owned row; a queued job is refused, another job keeps its rows."""
    url = database_url or f"sqlite:///{tmp_path / 'store.db'}"
    upgrade(url)
    engine = make_engine(url)
    sessions = make_session_factory(engine)
    cleanup = Cleanup(Settings(home=tmp_path / "home", cpu_slots=2, gpus="none"), sessions)
    spec = JobSpec.model_validate(JOB)
    with sessions() as s:
        doomed, kept = repo.create_job(s, spec).id, repo.create_job(s, spec).id
        s.commit()
    with pytest.raises(JobLive, match="cancel it first"):
        cleanup.delete(doomed)
    records = [RecordIn(1, 0, e, None, "loss", 0.5, 1.0) for e in range(RECORD_BATCH + 3)]
    with sessions() as s:
        for job_id in (doomed, kept):
            assert recordstore.insert_records(s, job_id, records) == len(records)
            assert repo.transition(s, job_id, JobState.starting)
            repo.allocate(s, job_id, [f"cpu:{job_id}"])
            assert repo.transition(s, job_id, JobState.failed, reason="test")
        s.commit()
    cleanup.delete(doomed)
    with pytest.raises(JobNotFound):
        cleanup.delete(doomed)
    with engine.connect() as conn:
        counts = {j: _counts(conn, j) for j in (doomed, kept)}
    engine.dispose()
    assert set(counts[doomed].values()) == {0}, counts[doomed]
    assert counts[kept]["jobs"] == 1 and counts[kept]["job_labels"] == 1
    assert counts[kept]["metric_records"] == len(records) and counts[kept]["allocations"] == 1


def test_delete_unknown_job_is_404(api: TestClient) -> None:
    r = api.delete("/jobs/12345")
    assert r.status_code == 404 and "12345" in r.json()["message"]


def test_retention_deletes_old_terminal_jobs(
    live_server_factory: Callable[..., LiveServer], database_url: str | None
) -> None:
    server = live_server_factory(
        TORCHYARD_RETENTION_DAYS=str(2 / 86400), TORCHYARD_RETENTION_SWEEP_S="0.2"
    )
    with server.client() as c:
        job_id = c.post("/jobs", json=JOB).json()["id"]
        server.wait_for(job_id, {"succeeded"})
        deadline = time.monotonic() + 30
        while c.get(f"/jobs/{job_id}").status_code != 404:
            assert time.monotonic() < deadline, "retention did not delete the job"
            time.sleep(0.2)
    assert set(_rows_of(server, database_url, job_id).values()) == {0}
    assert not (server.home / "runs" / str(job_id)).exists()


def test_unused_packages_are_collected_after_the_grace(tmp_path: Path) -> None:
    store = PackageStore(tmp_path / "packages", Limits(max_files=10, max_unpacked_bytes=10**6))
    base = store.root / "sha256"
    for name in ("a" * 64, "b" * 64, "c" * 64):
        (base / name / "tree").mkdir(parents=True)
        (base / name / "meta.json").write_text("{}")
    old = time.time() - 1000
    for name in ("a" * 64, "b" * 64):
        os.utime(base / name / "meta.json", (old, old))
    removed = store.collect(grace_s=500, in_use={"sha256:" + "b" * 64})
    assert removed == ["sha256:" + "a" * 64]  # b is named by a waiting job; c is recent
    assert sorted(p.name for p in base.iterdir()) == ["b" * 64, "c" * 64]


def test_disk_floor_refuses_new_work_with_507(tmp_path: Path) -> None:
    token = "delete-tests-api-token-0123456789"
    settings = Settings(home=tmp_path / "home", cpu_slots=2, gpus="none",
                        api_tokens=[token], disk_free_floor_bytes=1024**5)  # 1 PiB: never free
    with TestClient(create_app(settings, run_supervisor=False), raise_server_exceptions=False,
                    headers={"Authorization": f"Bearer {token}"}) as c:
        r = c.post("/jobs", json=JOB)
        assert r.status_code == 507 and "DISK_FREE_FLOOR" in r.json()["message"], r.text
        r = c.post("/packages", content=b"PK\x05\x06" + b"\0" * 18)
        assert r.status_code == 507 and "running jobs carry on" in r.json()["message"]
        health = c.get("/healthz").json()
        assert health["disk_low"] is True and health["disk_free_bytes"] > 0
        metrics = c.get("/metrics").text
        assert "torchyard_disk_free_bytes " in metrics
