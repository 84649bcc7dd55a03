"""Scheduling API against the real app on a migrated database, SQLite and PostgreSQL (no processes
launched)."""

import time

from fastapi.testclient import TestClient

from tests.conftest import both_stores

pytestmark = both_stores

SMALL = {"dataset": "synthetic", "epochs": 1, "nproc_per_node": 1}


def test_repeated_idempotency_key_returns_the_same_job(api: TestClient) -> None:
    headers = {"Idempotency-Key": "ci-run-42"}
    first = api.post("/jobs", json=SMALL, headers=headers)
    again = api.post("/jobs", json=SMALL, headers=headers)
    assert first.status_code == 201 and again.status_code == 200
    assert again.json()["id"] == first.json()["id"]
    assert again.headers["location"] == first.headers["location"]
    assert len(api.get("/jobs").json()["items"]) == 1
    other = api.post("/jobs", json={**SMALL, "epochs": 2}, headers=headers)
    assert other.status_code == 409 and "Idempotency-Key" in other.json()["message"]
    assert api.post("/jobs", json=SMALL, headers={"Idempotency-Key": "x" * 201}).status_code == 422


def test_labels_are_stored_and_filter_the_list(api: TestClient) -> None:
    a = api.post("/jobs", json={**SMALL, "labels": {"team": "vision", "exp": "lr-sweep"}}).json()
    b = api.post("/jobs", json={**SMALL, "labels": {"team": "nlp"}}).json()
    api.post("/jobs", json=SMALL)
    assert a["spec"]["labels"] == {"team": "vision", "exp": "lr-sweep"}

    def ids(q: str) -> list[int]:
        return [j["id"] for j in api.get(f"/jobs?{q}").json()["items"]]

    assert ids("label=team=vision") == [a["id"]]
    assert ids("label=team") == [b["id"], a["id"]]
    assert ids("label=team=vision&label=exp=lr-sweep") == [a["id"]]
    assert ids("label=team=vision&label=exp=other") == []
    assert api.get("/jobs?label==x").status_code == 422
    bad = api.post("/jobs", json={**SMALL, "labels": {"../x": "y"}})
    assert bad.status_code == 422 and bad.json()["details"][0]["field"].startswith("labels")


def test_priority_is_bounded(api: TestClient) -> None:
    assert api.post("/jobs", json={**SMALL, "priority": 10}).json()["spec"]["priority"] == 10
    r = api.post("/jobs", json={**SMALL, "priority": 10**6})
    assert r.status_code == 422 and r.json()["details"][0]["field"] == "priority"


def test_resources_list_every_slot_free(api: TestClient) -> None:
    body = api.get("/resources").json()
    assert body["cpu"] == {"total": 4, "allocated": 0, "free": 4}
    assert body["gpu"] == {"total": 0, "allocated": 0, "free": 0}
    assert [r["name"] for r in body["items"]] == ["cpu:0", "cpu:1", "cpu:2", "cpu:3"]
    assert all(r["job_id"] is None for r in body["items"])


def test_wait_times_out_with_the_current_state_and_returns_at_once_when_terminal(
    api: TestClient,
) -> None:
    job_id = api.post("/jobs", json=SMALL).json()["id"]
    started = time.monotonic()
    r = api.get(f"/jobs/{job_id}/wait?timeout=0.5")
    assert r.status_code == 200 and r.json()["state"] == "queued"
    assert 0.4 <= time.monotonic() - started < 5
    api.post(f"/jobs/{job_id}/cancel")
    started = time.monotonic()
    assert api.get(f"/jobs/{job_id}/wait?timeout=60").json()["state"] == "cancelled"
    assert time.monotonic() - started < 2
    assert api.get("/jobs/999/wait?timeout=0").status_code == 404
    assert api.get(f"/jobs/{job_id}/wait?timeout=301").status_code == 422
