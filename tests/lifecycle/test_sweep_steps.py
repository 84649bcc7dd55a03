"""A sweep's record and its trials' front door (issue 44, items 9 and 10), on both stores: the
real app and a migrated database, the sweep driver stepped by hand (the loop does not run),
each trial's job moved through its states and given its records as a run would.

* Deleting trials' jobs, while the sweep runs and after it ended, never makes it make another
  trial and never changes its counts or its best (the sweep's own record, ``sweep_trials``).
* A sweep's base spec gets every check ``POST /jobs`` makes (422 naming ``spec.<field>``, 507
  below the disk floor), and each trial gets them again when it is made: a refused trial fails
  the sweep with its reason and makes no job.
"""

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from service.app import create_app
from service.domain.loop.supervisor import Supervisor
from service.settings import Settings
from service.store import records as recordstore
from service.store import repository as repo
from service.store.records import RecordIn
from tests.conftest import both_stores
from torchyard_contract.state import JobState

pytestmark = both_stores

BUILTIN = {"dataset": "synthetic", "epochs": 1, "synthetic_samples": 64, "device": "cpu"}
# Grid points in the order the sweep makes them does not matter: the best is x = 1 wherever.
XS = [3, 1, 2]


@pytest.fixture
def app_of(tmp_path: Path, database_url: str | None) -> Iterator[Callable[..., TestClient]]:
    """``app_of(**settings)``: the app on the test's database, its supervisor holding the lease
    (recovery of an empty database done) but its loop not running."""
    clients: list[TestClient] = []

    def make(**settings: object) -> TestClient:
        app = create_app(Settings(home=tmp_path / "home", cpu_slots=2, gpus="none",
                                  warm_ranks=False, database_url=database_url, **settings),
                         run_supervisor=False)
        client = TestClient(app, raise_server_exceptions=False)
        client.__enter__()
        clients.append(client)
        supervisor = _supervisor(app)
        assert supervisor.lease is not None and supervisor.lease.renew()
        assert supervisor._lead()
        return client

    yield make
    for client in clients:
        client.__exit__(None, None, None)


def _supervisor(app: FastAPI) -> Supervisor:
    return app.state.supervisor


def _step(client: TestClient) -> None:
    _supervisor(client.app).sweep_driver.step()  # type: ignore[arg-type]


def _run(client: TestClient, job_id: int, loss: float) -> None:
    """The job starts, runs, reports ``loss`` for epoch 1 and succeeds."""
    sessions = client.app.state.session_factory  # type: ignore[attr-defined]
    with sessions() as s:
        assert repo.transition(s, job_id, JobState.starting)
        assert repo.transition(s, job_id, JobState.running)
        recordstore.insert_records(s, job_id, [RecordIn(1, 0, 1, None, "loss", loss, 1.0)])
        assert repo.transition(s, job_id, JobState.succeeded)
        s.commit()


def _sweep(client: TestClient, sweep_id: int) -> dict:
    r = client.get(f"/sweeps/{sweep_id}")
    assert r.status_code == 200, r.text
    return r.json()


def _live(sweep: dict) -> list[dict]:
    return [t for t in sweep["trials"] if t["outcome"] is None]


def test_deleting_trials_jobs_makes_no_trial_and_keeps_counts_and_best(
    app_of: Callable[..., TestClient],
) -> None:
    c = app_of()
    r = c.post("/sweeps", json={"name": "record", "spec": BUILTIN, "method": "grid",
                                "space": {"epochs": {"type": "choice", "values": XS}}})
    assert r.status_code == 201, r.text
    sweep_id = r.json()["id"]
    deleted: dict[int, float] = {}  # job id → its trial's value
    for made in range(1, len(XS) + 1):
        _step(c)
        sweep = _sweep(c, sweep_id)
        assert len(sweep["trials"]) == made, sweep  # one at a time (parallel 1)
        [trial] = _live(sweep)
        loss = float(trial["params"]["epochs"])
        _run(c, trial["job_id"], loss)
        _step(c)  # the driver sees it end (and makes the next trial)
        assert c.delete(f"/jobs/{trial['job_id']}").status_code == 204  # the sweep runs on
        deleted[trial["job_id"]] = loss
        _step(c)
    sweep = _sweep(c, sweep_id)
    assert sweep["state"] == "succeeded", sweep
    assert [t["job_id"] for t in sweep["trials"]] == list(deleted)  # none made after a delete
    assert sweep["counts"] == {"queued": 0, "running": 0, "completed": 3, "pruned": 0,
                               "failed": 0, "cancelled": 0}
    best = min(deleted, key=deleted.__getitem__)
    assert sweep["best"] == {"job_id": best, "params": {"epochs": 1}, "value": 1.0}
    for t in sweep["trials"]:
        assert t["deleted"] and t["state"] == "succeeded" and t["outcome"] == "completed"
        assert t["value"] == deleted[t["job_id"]] and t["epochs"] == []
    assert c.get("/jobs", params={"label": f"sweep={sweep_id}"}).json()["items"] == []


def test_an_ended_sweeps_record_outlives_its_trials_jobs(app_of: Callable[..., TestClient]) -> None:
    c = app_of()
    r = c.post("/sweeps", json={"spec": BUILTIN, "method": "grid", "parallel": 3,
                                "space": {"epochs": {"type": "choice", "values": XS}}})
    sweep_id = r.json()["id"]
    _step(c)
    trials = _sweep(c, sweep_id)["trials"]
    assert len(trials) == 3
    for t in trials:
        _run(c, t["job_id"], float(t["params"]["epochs"]))
    _step(c)
    before = _sweep(c, sweep_id)
    assert before["state"] == "succeeded" and before["best"]["value"] == 1.0
    for t in trials:
        assert c.delete(f"/jobs/{t['job_id']}").status_code == 204
    _step(c)
    after = _sweep(c, sweep_id)
    assert after["best"] == before["best"] and after["counts"] == before["counts"]
    assert [(t["job_id"], t["params"], t["value"], t["deleted"]) for t in after["trials"]] == [
        (t["job_id"], t["params"], t["value"], True) for t in before["trials"]]


@pytest.mark.parametrize(("patch", "field", "status"), [
    ({"notify": ["nosuch"]}, "spec.notify", 422),
    ({"resume_from": 4242}, "spec.resume_from", 422),
    ({"nproc_per_node": 3}, "spec.nproc_per_node", 422),
])
def test_a_sweeps_spec_gets_every_check_of_post_jobs(
    app_of: Callable[..., TestClient], patch: dict, field: str, status: int
) -> None:
    c = app_of()
    spec = {**BUILTIN, **patch}
    job = c.post("/jobs", json=spec)
    assert job.status_code == status, job.text  # what POST /jobs says of it …
    r = c.post("/sweeps", json={"spec": spec, "space": {"lr": {"type": "uniform", "low": 0.01,
                                                               "high": 0.1}}})
    assert r.status_code == status, r.text  # … the sweep says of its spec, naming it
    assert [d["field"] for d in r.json()["details"]] == [field], r.json()
    assert r.json()["message"].startswith(f"{field}: ")
    assert c.get("/sweeps").json()["items"] == []


def test_below_the_disk_floor_a_sweep_is_507(app_of: Callable[..., TestClient]) -> None:
    c = app_of(disk_free_floor_bytes=1024**5)
    r = c.post("/sweeps", json={"spec": BUILTIN, "space": {"lr": {"type": "uniform",
                                                                   "low": 0.01, "high": 0.1}}})
    assert r.status_code == 507 and r.json()["error"] == "insufficient_storage", r.text


def test_a_trial_refused_when_it_is_made_fails_the_sweep(
    app_of: Callable[..., TestClient],
) -> None:
    """``resume_from`` names a job when the sweep is created; that job is deleted before the
    first trial is made: the trial is refused as POST /jobs would refuse it, the sweep fails
    saying so, and no job is made."""
    c = app_of()
    base = c.post("/jobs", json=BUILTIN).json()["id"]
    _run(c, base, 0.5)
    r = c.post("/sweeps", json={"spec": {**BUILTIN, "resume_from": base}, "max_trials": 2,
                                "space": {"lr": {"type": "uniform", "low": 0.01, "high": 0.1}}})
    assert r.status_code == 201, r.text
    sweep_id = r.json()["id"]
    assert c.delete(f"/jobs/{base}").status_code == 204
    _step(c)
    sweep = _sweep(c, sweep_id)
    assert sweep["state"] == "failed", sweep
    assert sweep["reason"] == f"trial 1 is refused as a job: resume_from: job {base} not found"
    assert sweep["trials"] == []
    assert c.get("/jobs").json()["items"] == []
