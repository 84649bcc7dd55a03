"""``GET /sweeps/{id}/series``: a sweep's page in one read — each trial's row (the pruned one
with the epoch it stopped at) and its objective per epoch reduced across ranks, downsampled.

The sweep and its trials are stored rows (the driver that makes them is tested in
tests/lifecycle/test_sweeps.py; here only the read path)."""

import math

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import insert

from service.domain.sweeps.spec import SweepSpec
from service.store import records as recordstore
from service.store import repository as repo
from service.store import sweeps as sweepstore
from service.store.tables import MetricRecord
from torchyard_contract.state import JobState

LONG = 1000  # epochs of the completed trial: more than max_points


def _sweep(api: TestClient) -> tuple[int, list[int]]:
    """A sweep with three 2-rank trials: completed after LONG epochs, pruned at epoch 3,
    running at epoch 2 (its rank 1 behind, at epoch 1)."""
    spec = SweepSpec.model_validate({
        "name": "s", "spec": {"dataset": "synthetic", "nproc_per_node": 2},
        "space": {"lr": {"type": "log_uniform", "low": 1e-4, "high": 1.0}},
        "prune": {"type": "median"}, "max_trials": 3,
    })
    factory = api.app.state.session_factory  # type: ignore[attr-defined]
    with factory() as session:
        sweep = sweepstore.create_sweep(session, "s", 0, spec.model_dump(mode="json"))
        ids = []
        for n, lr in enumerate((0.1, 0.01, 0.5), start=1):
            job = repo.create_job(session, spec.trial_spec(sweep.id, n, {"lr": lr}))
            sweepstore.mark_trial(session, job.id, sweep.id, n, {"lr": lr})
            repo.transition(session, job.id, JobState.starting)
            ids.append(job.id)
        rows = []

        def epochs(job_id: int, last: int, ranks: tuple[int, ...] = (0, 1)) -> None:
            rows.extend(
                {"job_id": job_id, "attempt": 1, "rank": r, "epoch": e,
                 "step": recordstore.EPOCH_STEP, "name": "loss", "value": 1 / e + r,
                 "nonfinite": None, "time": 0.0}
                for r in ranks for e in range(1, last + 1))

        epochs(ids[0], LONG)
        epochs(ids[1], 5)  # records past the pruning epoch (in flight when it was pruned)
        epochs(ids[2], 2, (0,))
        epochs(ids[2], 1, (1,))
        session.execute(insert(MetricRecord), rows)
        repo.transition(session, ids[0], JobState.succeeded)
        assert sweepstore.prune_trial(session, ids[1], 3, "pruned by the median rule at epoch 3")
        repo.transition(session, ids[2], JobState.running)
        session.commit()
        return sweep.id, ids


def test_sweep_series_gives_each_trial_its_row_and_downsampled_objective(api: TestClient) -> None:
    sweep_id, (done, pruned, running) = _sweep(api)
    r = api.get(f"/sweeps/{sweep_id}/series", params={"max_points": 100})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["max_points"] == 100
    assert body["sweep"]["id"] == sweep_id and body["sweep"]["trials"] == []
    assert body["sweep"]["counts"]["completed"] == 1 and body["sweep"]["counts"]["pruned"] == 1
    assert body["sweep"]["best"]["job_id"] == done
    trials = {t["job_id"]: t for t in body["trials"]}
    assert list(trials) == [done, pruned, running]  # oldest first

    t = trials[done]
    assert t["outcome"] == "completed" and t["pruned_epoch"] is None and t["params"] == {"lr": 0.1}
    assert t["points"] == LONG and len(t["x"]) <= 102, "downsampled to max_points"
    assert t["x"][0] == 1 and t["x"][-1] == LONG and t["x"] == sorted(t["x"])
    assert t["y"][0] == 1.5, "epoch 1: the mean of rank 0 (1.0) and rank 1 (2.0)"
    assert t["value"] == t["y"][-1] == pytest.approx(1 / LONG + 0.5)

    t = trials[pruned]
    assert t["outcome"] == "pruned" and t["state"] == "cancelled" and t["pruned_epoch"] == 3
    assert t["x"] == [1, 2, 3], "cut where it was stopped"
    assert t["value"] is None and t["reason"].startswith("pruned by the median rule")

    t = trials[running]
    assert t["outcome"] is None and t["state"] == "running"
    assert t["x"] == [1] and t["points"] == 1, "only epochs every rank reported"


def test_sweep_series_refuses_bad_input_clearly(api: TestClient) -> None:
    r = api.get("/sweeps/99/series")
    assert r.status_code == 404 and "sweep 99" in r.json()["message"]
    sweep_id, _ = _sweep(api)
    r = api.get(f"/sweeps/{sweep_id}/series", params={"max_points": 3})
    assert r.status_code == 422 and r.json()["details"][0]["field"] == "max_points"
    r = api.get(f"/sweeps/{sweep_id}/series", params={"max_points": 20_001})
    assert r.status_code == 422
    whole = api.get(f"/sweeps/{sweep_id}/series", params={"max_points": 20_000}).json()
    assert whole["trials"][0]["x"] == list(range(1, LONG + 1))
    assert all(math.isfinite(y) for y in whole["trials"][0]["y"])
