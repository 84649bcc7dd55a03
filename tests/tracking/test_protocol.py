"""The exactly-once protocol of the MLflow export, against a tracking store that keeps every
point it is sent (MLflow's file store does; its SQL stores happen to drop exact duplicates, so
the live tests alone could not fail on a re-sent batch): a batch whose answer was lost is sent
again less what the run's history holds, and each point lands once. Also the pure parts: the
mean is the dashboard's, batches do not change the points, a spec's ``mlflow`` is refused
where the server has no tracking server, the exporter yields while the server is busy.
"""

import json
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient

from service.domain.lease import Lease
from service.domain.records.downsample import epoch_mean
from service.domain.tracking.budget import WINDOW_S, CpuBudget
from service.domain.tracking.mlflowclient import MlflowClient, MlflowError
from service.domain.tracking.points import MeanFold, rank_point
from service.domain.tracking.runexport import RunExporter
from service.settings import Settings
from service.store import records as recordstore
from service.store import repository as repo
from service.store import tracking as store
from service.store.records import RecordIn
from tests.conftest import both_stores
from torchyard_contract.spec import JobSpec
from torchyard_contract.state import JobState


@dataclass
class Row:
    """A stored record as the store's reads give it."""

    seq: int
    attempt: int
    rank: int
    epoch: int
    step: int
    name: str
    value: float | None
    nonfinite: str | None
    time: float


@dataclass
class KeepsEveryPoint:
    """A tracking server whose log-batch appends (no de-duplication); ``lose_answer`` makes the
    next log-batch of metrics take effect and then answer 503, as a proxy timing out would."""

    points: list[tuple] = field(default_factory=list)
    tags: dict[str, str] = field(default_factory=dict)
    status: str = "RUNNING"
    lose_answer: bool = False

    def handle(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path.removeprefix("/api/2.0/mlflow/")
        body = json.loads(request.content) if request.content else {}
        if path == "experiments/get-by-name":
            return httpx.Response(200, json={"experiment": {"experiment_id": "7",
                                                            "lifecycle_stage": "active"}})
        if path == "runs/search":
            return httpx.Response(200, json={})
        if path == "runs/create":
            self.tags.update({t["key"]: t["value"] for t in body["tags"]})
            return httpx.Response(200, json={"run": {"info": {
                "run_id": "r1", "artifact_uri": "mlflow-artifacts:/7/r1/artifacts"}}})
        if path == "runs/log-batch":
            self.tags.update({t["key"]: t["value"] for t in body.get("tags", [])})
            metrics = body.get("metrics", [])
            self.points += [(m["key"], m["step"], m["timestamp"], m["value"]) for m in metrics]
            if metrics and self.lose_answer:
                self.lose_answer = False
                return httpx.Response(503, json={"error_code": "TEMPORARILY_UNAVAILABLE"})
            return httpx.Response(200, json={})
        if path == "metrics/get-history":
            key = request.url.params["metric_key"]
            return httpx.Response(200, json={"metrics": [
                {"key": k, "step": s, "timestamp": t, "value": v}
                for k, s, t, v in self.points if k == key]})
        if path == "runs/update":
            self.status = body["status"]
            return httpx.Response(200, json={})
        return httpx.Response(404, json={"error_code": "ENDPOINT_NOT_FOUND"})


def _rows(ranks: int, epochs: int, attempt: int = 1, first_seq: int = 1) -> list[Row]:
    rows, seq = [], first_seq
    for epoch in range(1, epochs + 1):
        for rank in range(ranks):
            for name in ("loss", "acc"):
                value = 1.0 / (epoch + rank + attempt) if name == "loss" else 0.1 * epoch
                rows.append(Row(seq, attempt, rank, epoch, -1, name, value, None,
                                1_700_000_000 + seq * 0.25))
                seq += 1
    return rows


def test_the_mean_is_the_dashboards_and_batching_does_not_change_the_points() -> None:
    # Two ranks, three epochs; a restart repeats epochs 2 and 3, rank 1's epoch 3 of the first
    # attempt is missing (it failed mid-epoch), and rank 0 reports a NaN in the second attempt.
    rows = [r for r in _rows(2, 3) if not (r.rank == 1 and r.epoch == 3)]
    again = [r for r in _rows(2, 3, attempt=2, first_seq=100) if r.epoch >= 2]
    again[0] = Row(**{**again[0].__dict__, "value": None, "nonfinite": "NaN"})
    rows += again
    whole = MeanFold(2)
    points = whole.fold(rows) + whole.final()
    cut = MeanFold(2)
    in_batches = [p for i in range(0, len(rows), 3) for p in cut.fold(rows[i:i + 3])]
    assert repr(in_batches + cut.final()) == repr(points)  # (NaN == NaN as text)
    # The latest value of each mean series is the dashboard's mean (epoch_mean) at each epoch.
    latest: dict[tuple[str, int], Any] = {}
    for p in points:
        if (p.key, p.step) not in latest or p.timestamp_ms >= latest[(p.key, p.step)].timestamp_ms:
            latest[(p.key, p.step)] = p
    for name in ("loss", "acc"):
        mine = [r for r in rows if r.name == name]
        values = np.array([math.nan if r.nonfinite else r.value for r in mine])
        xs, ys = epoch_mean(np.array([r.attempt for r in mine]), np.array([r.rank for r in mine]),
                            np.array([r.epoch for r in mine]), values)
        got = [latest[(name, int(x))].value for x in xs]
        assert np.allclose(got, ys, equal_nan=True), (name, got, ys)
    # Epoch 3 was first complete in attempt 2 only: one mean point; epoch 2 in both attempts:
    # two, the later one the second attempt's.
    assert Counter(p.step for p in points if p.key == "loss") == {1: 1, 2: 2, 3: 1}
    # Every record is a point of its rank's series, the same in any batching.
    assert [rank_point(r) for r in rows] == [rank_point(r) for r in rows[::-1]][::-1]


@both_stores
def test_a_batch_whose_answer_was_lost_is_sent_again_less_what_mlflow_has(
    sessions: Any, tmp_path: Path,
) -> None:
    settings = Settings(home=tmp_path, gpus="none", cpu_slots=2,
                        mlflow_tracking_uri="http://mlflow.invalid")
    with sessions() as session:
        job = repo.create_job(session, JobSpec(name="p", nproc_per_node=2, epochs=3))
        store.add_export(session, job_id=job.id, mlflow=True, tensorboard=False,
                         experiment="torchyard")
        recordstore.insert_records(session, job.id, [
            RecordIn(r.attempt, r.rank, r.epoch, None, r.name, r.value, r.time)  # type: ignore[arg-type]
            for r in _rows(2, 3)])
        session.commit()
        job_id = job.id
    lease = Lease(sessions, 300.0)  # held for the whole test, renewed by no thread
    assert lease.renew()
    mlflow = KeepsEveryPoint()
    client = MlflowClient("http://mlflow.invalid", httpx.Client(
        transport=httpx.MockTransport(mlflow.handle)))
    runs = RunExporter(settings, client, sessions, sessions, lease, lambda s, w: None)

    def row() -> Any:
        with sessions() as session:
            return store.export_of_job(session, job_id)

    assert runs.step_job(row())  # the run
    mlflow.lose_answer = True
    with pytest.raises(MlflowError) as lost:
        runs.step_job(row())  # every record: taken by MLflow, answered 503
    assert lost.value.unknown_outcome
    runs.forget()  # as the exporter does after a failure (or a new process after a crash)
    assert row().sent_seq > row().acked_seq == 0
    assert runs.step_job(row())  # sent again: nothing MLflow holds already
    assert row().sent_seq == row().acked_seq > 0
    with sessions() as session:
        repo.transition(session, job_id, JobState.starting)
        repo.transition(session, job_id, JobState.running)
        repo.transition(session, job_id, JobState.succeeded)
        session.commit()
    while runs.step_job(row()):
        pass
    assert mlflow.status == "FINISHED" and row().mlflow_done
    counts = Counter(mlflow.points)
    assert max(counts.values()) == 1, [p for p, n in counts.items() if n > 1]
    # 2 ranks x 3 epochs x 2 metrics, and each mean at each epoch once.
    assert len(mlflow.points) == 12 + 6
    assert mlflow.tags["torchyard.job_id"] == str(job_id)


def test_mlflow_in_a_spec_is_refused_where_the_server_has_no_tracking_server(
    api: TestClient,
) -> None:
    for value in (True, {"experiment": "x"}):
        answer = api.post("/jobs", json={"mlflow": value})
        assert answer.status_code == 422, answer.text
        assert "TORCHYARD_MLFLOW_TRACKING_URI" in answer.json()["message"]
    answer = api.post("/jobs", json={"mlflow": {"experiment": "", "log_outputs": "yes"}})
    assert answer.status_code == 422
    assert "mlflow" in answer.text
    job = api.post("/jobs", json={"mlflow": False, "dataset": "synthetic"})
    assert job.status_code == 201, job.text
    assert job.json()["spec"]["mlflow"] is False
    assert api.get(f"/jobs/{job.json()['id']}").json()["mlflow"] is None


def test_the_exporter_yields_while_the_process_is_busy() -> None:
    w = WINDOW_S
    clock, process = [0.0], [0.0]
    budget = CpuBudget(process_time=lambda: process[0], clock=lambda: clock[0])
    assert budget.allows() and not budget.held_back
    # A window in which the rest of the process (the routes) took 90 % of a core.
    clock[0], process[0] = w, 0.9 * w
    assert budget.allows() and budget.held_back
    budget.spend(0.01 * w)
    clock[0], process[0] = 1.1 * w, 1.0 * w
    assert not budget.allows()  # 10 % of a core: over the 5 % it may take while busy
    clock[0] = 1.5 * w
    assert budget.allows()  # 2 %
    # A quiet window: the exporter takes what it needs.
    clock[0], process[0] = 2.5 * w, 1.2 * w
    assert budget.allows() and not budget.held_back
    budget.spend(0.5 * w)
    clock[0], process[0] = 2.6 * w, 1.7 * w
    assert budget.allows()


@both_stores
def test_the_outbox_lists_unfinished_rows_sweeps_first_and_is_done_when_each_export_is(
    sessions: Any,
) -> None:
    with sessions() as session:
        job = repo.create_job(session, JobSpec(name="a"))
        store.add_export(session, job_id=job.id, mlflow=True, tensorboard=True, experiment="e")
        recordstore.insert_records(session, job.id, [RecordIn(1, 0, 1, None, "loss", 0.5, 1.0)])
        store.add_export(session, sweep_id=9, mlflow=True, tensorboard=False, experiment="e")
        session.commit()
        job_id = job.id
    with sessions() as session:
        pending = store.unfinished(session, 10)
        assert [p.export.sweep_id for p in pending] == [9, None]  # the sweep's run first
        assert pending[0].state is None  # no such sweep
        row = pending[1]
        assert (row.state, row.ran, row.last_seq > 0) == ("queued", False, True)
        store.update_export(session, row.export.id, mlflow_done=True)
        session.commit()
        assert not store.export_of_job(session, job_id).done  # its event files are not
        store.update_export(session, row.export.id, tensorboard_done=True, error="a\nb  c")
        session.commit()
        done = store.export_of_job(session, job_id)
        assert done.done and done.error == "a b c"
        assert [p.export.sweep_id for p in store.unfinished(session, 10)] == [9]
        # A queued job whose run is made and SCHEDULED, with nothing to send, is not scanned.
        queued = repo.create_job(session, JobSpec(name="q"))
        store.add_export(session, job_id=queued.id, mlflow=True, tensorboard=True,
                         experiment="e")
        session.commit()
        assert [p.export.job_id for p in store.unfinished(session, 10)] == [None, queued.id]
        store.update_export(session, store.export_of_job(session, queued.id).id, run_id="r",
                            status="SCHEDULED")
        session.commit()
        assert [p.export.job_id for p in store.unfinished(session, 10)] == [None]
