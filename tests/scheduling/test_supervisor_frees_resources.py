"""Supervisor edge cases on the real app and a migrated database (SQLite and PostgreSQL), with the
supervisor running: resources are never left held by a job that cannot use them."""

import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.settings import Settings
from service.store import repository as repo
from tests.conftest import both_stores
from torchyard_contract.rundir import RunDir
from torchyard_contract.state import JobState

SPEC = {"dataset": "synthetic", "epochs": 1, "nproc_per_node": 2}


pytestmark = both_stores


@pytest.fixture
def settings(database_url: str | None) -> Callable[..., Settings]:
    def make(home: Path, slots: int = 4) -> Settings:
        return Settings(home=home, cpu_slots=slots, gpus="none", poll_interval_s=0.05,
                        database_url=database_url)

    return make


def _until(predicate: Callable[[], bool], timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)


def test_restart_frees_a_cancelled_jobs_resources(
    tmp_path: Path, settings: Callable[..., Settings]
) -> None:
    # Before the restart: a launched job holds two slots and is cancelled, and the server stops
    # before its group was reaped (as when it is killed within the stop grace).
    first = create_app(settings(tmp_path / "home"), run_supervisor=False)
    with TestClient(first) as c:
        job_id = c.post("/jobs", json=SPEC).json()["id"]
        with first.state.session_factory() as session:
            assert repo.transition(session, job_id, JobState.starting)
            repo.allocate(session, job_id, ["cpu:0", "cpu:1"])
            session.commit()
        assert c.post(f"/jobs/{job_id}/cancel").json()["state"] == "cancelled"
        assert c.get("/resources").json()["cpu"]["allocated"] == 2
    with TestClient(create_app(settings(tmp_path / "home"))) as c:
        assert c.get("/resources").json()["cpu"]["allocated"] == 0
        assert c.get(f"/jobs/{job_id}").json()["state"] == "cancelled"


def test_a_job_that_no_longer_fits_fails_instead_of_blocking_the_queue(
    tmp_path: Path, settings: Callable[..., Settings]
) -> None:
    with TestClient(create_app(settings(tmp_path / "home", slots=4), run_supervisor=False)) as c:
        big = c.post("/jobs", json={**SPEC, "nproc_per_node": 4}).json()["id"]
    # Restarted with fewer slots.
    app = create_app(settings(tmp_path / "home", slots=2))
    with TestClient(app) as c:
        _until(lambda: c.get(f"/jobs/{big}").json()["state"] == "failed")
        assert c.get(f"/jobs/{big}").json()["reason"] == (
            "nproc_per_node: needs 4 CPU slots; this host has 2"
        )


def test_a_launch_that_fails_before_the_attempt_loop_fails_the_job_and_frees_it(
    tmp_path: Path, settings: Callable[..., Settings]
) -> None:
    home = tmp_path / "home"
    app = create_app(settings(home))
    with TestClient(app) as c:
        # The run directory cannot be made: a file stands where the runs dir should be.
        shutil.rmtree(home / "runs")
        (home / "runs").write_text("not a directory")
        job_id = c.post("/jobs", json=SPEC).json()["id"]
        _until(lambda: c.get(f"/jobs/{job_id}").json()["state"] == "failed")
        job = c.get(f"/jobs/{job_id}").json()
        assert job["reason"].startswith("could not start:"), job["reason"]
        assert c.get("/resources").json()["cpu"]["allocated"] == 0


def test_a_launch_cut_off_before_its_attempt_loop_started_is_given_up_for_good(
    tmp_path: Path, settings: Callable[..., Settings]
) -> None:
    """The server died after committing ``starting`` and before any attempt loop ran: the recovery
    fails the job, frees its slots and claims the run, so an attempt loop that starts late runs nothing."""
    home = tmp_path / "home"
    first = create_app(settings(home), run_supervisor=False)
    with TestClient(first) as c:
        job_id = c.post("/jobs", json=SPEC).json()["id"]
        with first.state.session_factory() as session:
            assert repo.transition(session, job_id, JobState.starting)
            repo.allocate(session, job_id, ["cpu:0", "cpu:1"])
            session.commit()
    with TestClient(create_app(settings(home))) as c:
        # Recovery frees the slots at once; the finisher thread makes the job terminal.
        assert c.get("/resources").json()["cpu"]["allocated"] == 0
        deadline = time.monotonic() + 10
        while (job := c.get(f"/jobs/{job_id}").json())["state"] != "failed":
            assert job["state"] == "starting" and time.monotonic() < deadline, job
            time.sleep(0.05)
        assert "never started" in job["reason"], job
    run = RunDir.for_job(home / "runs", job_id)
    late = subprocess.run(
        [sys.executable, "-m", "service.run.attemptloop", str(run.root)], capture_output=True, timeout=60,
        check=False,
    )
    assert late.returncode == 0 and b"claimed already" in late.stderr
    assert not run.exit_file.exists() and not run.attempts_dir.exists()
