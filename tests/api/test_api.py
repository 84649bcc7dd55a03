"""API contract against the real app on a database migrated by Alembic (SQLite and PostgreSQL)."""

import math

from fastapi.testclient import TestClient

from tests.conftest import both_stores, give_token

pytestmark = both_stores

DIGITS = {"name": "digits-ddp", "model": "mlp", "dataset": "digits", "epochs": 5,
          "batch_size": 64, "lr": 0.05, "nproc_per_node": 2}


def test_submit_fills_defaults_and_sets_location(api: TestClient) -> None:
    r = api.post("/jobs", json=DIGITS)
    assert r.status_code == 201
    job = r.json()
    assert r.headers["location"] == f"/jobs/{job['id']}"
    assert job["state"] == "queued"
    assert job["spec"]["optimizer"] == "sgd" and job["spec"]["device"] == "auto"
    assert api.get(f"/jobs/{job['id']}").json()["spec"] == job["spec"]


def test_bad_spec_names_field_and_allowed_values(api: TestClient) -> None:
    r = api.post("/jobs", json={**DIGITS, "optimizer": "rmsprop", "colour": "red"})
    assert r.status_code == 422
    body = r.json()
    assert body["error"] == "invalid_request"
    fields = {d["field"]: d["message"] for d in body["details"]}
    assert "sgd" in fields["optimizer"] and "adamw" in fields["optimizer"]
    assert fields["colour"] == "unknown field"


def test_bad_numbers_and_types_are_4xx(api: TestClient) -> None:
    for bad in ({"epochs": 0}, {"lr": -1}, {"batch_size": "x"}, {"nproc_per_node": 10**9},
                {"name": "../etc"}, {"device": "tpu"}):
        r = api.post("/jobs", json={**DIGITS, **bad})
        assert r.status_code == 422, (bad, r.text)
        assert r.json()["details"][0]["field"] == next(iter(bad))
    assert api.post("/jobs", content=b"{not json", headers={"content-type": "application/json"}
                    ).status_code == 422


def test_more_ranks_than_slots_is_unschedulable(api: TestClient) -> None:
    r = api.post("/jobs", json={**DIGITS, "nproc_per_node": 5})
    assert r.status_code == 422
    assert "needs 5 CPU slots; this host has 4" in r.json()["message"]


def test_unknown_job_is_404(api: TestClient) -> None:
    for path in ("/jobs/999", "/jobs/999/metrics"):
        r = api.get(path)
        assert r.status_code == 404 and r.json()["error"] == "not_found"
    assert api.post("/jobs/999/cancel").status_code == 404


def test_list_filters_and_cursor(api: TestClient) -> None:
    ids = [api.post("/jobs", json={**DIGITS, "name": f"j{i % 2}"}).json()["id"] for i in range(5)]
    api.post(f"/jobs/{ids[0]}/cancel")
    page = api.get("/jobs", params={"limit": 2}).json()
    assert [j["id"] for j in page["items"]] == [ids[4], ids[3]]
    page2 = api.get("/jobs", params={"limit": 2, "before": page["next_before"]}).json()
    assert [j["id"] for j in page2["items"]] == [ids[2], ids[1]]
    assert [j["id"] for j in api.get("/jobs?state=cancelled").json()["items"]] == [ids[0]]
    assert {j["name"] for j in api.get("/jobs?name=j1").json()["items"]} == {"j1"}
    assert api.get("/jobs?state=nope").status_code == 422
    assert api.get("/jobs?limit=100000").status_code == 422


def test_cancel_queued_then_again_is_noop(api: TestClient) -> None:
    job_id = api.post("/jobs", json=DIGITS).json()["id"]
    first = api.post(f"/jobs/{job_id}/cancel").json()
    assert first["state"] == "cancelled" and first["ended_at"]
    second = api.post(f"/jobs/{job_id}/cancel")
    assert second.status_code == 200 and second.json() == first


def test_records_need_the_jobs_token(api: TestClient) -> None:
    a = api.post("/jobs", json=DIGITS).json()["id"]
    b = api.post("/jobs", json=DIGITS).json()["id"]
    token_a = give_token(api, a)
    give_token(api, b)
    rec = {"records": [{"rank": 0, "epoch": 1, "name": "loss", "value": 1.0, "time": 1.0}]}
    assert api.post(f"/jobs/{a}/records", json=rec).status_code == 401  # no credentials
    assert api.post(f"/jobs/{a}/records", json=rec,
                    headers={"authorization": "Bearer wrong"}).status_code == 403
    assert api.post(f"/jobs/{b}/records", json=rec,
                    headers={"authorization": f"Bearer {token_a}"}).status_code == 403
    assert api.post(f"/jobs/{a}/records", json=rec,
                    headers={"authorization": f"Bearer {token_a}"}).status_code == 200


def test_ingest_is_idempotent_and_cursor_returns_each_once(api: TestClient) -> None:
    job_id = api.post("/jobs", json=DIGITS).json()["id"]
    auth = {"authorization": f"Bearer {give_token(api, job_id)}"}
    batch = [{"rank": r, "epoch": e, "name": "loss", "value": 1.0 / e, "time": 1.0}
             for e in range(1, 4) for r in range(2)]
    first = api.post(f"/jobs/{job_id}/records", json={"records": batch}, headers=auth).json()
    assert first == {"accepted": 6, "duplicates": 0}
    replay = api.post(f"/jobs/{job_id}/records", json={"records": batch}, headers=auth).json()
    assert replay == {"accepted": 0, "duplicates": 6}

    seen, after = [], 0
    while True:
        page = api.get(f"/jobs/{job_id}/metrics", params={"after": after, "limit": 4}).json()
        if not page["items"]:
            break
        assert page["state"] == "starting"
        seen += page["items"]
        after = page["next_after"]
    assert len(seen) == 6
    assert [s["seq"] for s in seen] == sorted({s["seq"] for s in seen})
    assert all(s["step"] is None and s["attempt"] == 1 for s in seen)
    only_rank1 = api.get(f"/jobs/{job_id}/metrics?rank=1").json()["items"]
    assert {s["rank"] for s in only_rank1} == {1} and len(only_rank1) == 3


def test_nonfinite_values_are_stored_and_returned_as_strings(api: TestClient) -> None:
    job_id = api.post("/jobs", json=DIGITS).json()["id"]
    auth = {"authorization": f"Bearer {give_token(api, job_id)}"}
    records = [
        {"rank": 0, "epoch": 1, "name": "loss", "value": "NaN", "time": 1.0},
        {"rank": 0, "epoch": 2, "name": "loss", "value": "Infinity", "time": 1.0},
        {"rank": 0, "epoch": 3, "name": "loss", "value": "-Infinity", "time": 1.0},
        {"rank": 0, "epoch": 4, "name": "loss", "value": 0.5, "time": 1.0},
    ]
    assert api.post(f"/jobs/{job_id}/records", json={"records": records},
                    headers=auth).status_code == 200
    # A bare NaN literal (Python's json.dumps default) is accepted too.
    raw = b'{"records": [{"rank": 1, "epoch": 1, "name": "loss", "value": NaN, "time": 1.0}]}'
    assert api.post(f"/jobs/{job_id}/records", content=raw,
                    headers={**auth, "content-type": "application/json"}).status_code == 200
    values = [i["value"] for i in api.get(f"/jobs/{job_id}/metrics").json()["items"]]
    assert values == ["NaN", "Infinity", "-Infinity", 0.5, "NaN"]
    assert math.isfinite(values[3])


def test_bad_records_are_422(api: TestClient) -> None:
    job_id = api.post("/jobs", json=DIGITS).json()["id"]
    auth = {"authorization": f"Bearer {give_token(api, job_id)}"}
    for bad in ({"rank": -1}, {"value": "banana"}, {"name": "a b"}, {"extra": 1}):
        rec = {"rank": 0, "epoch": 1, "name": "loss", "value": 1.0, "time": 1.0, **bad}
        r = api.post(f"/jobs/{job_id}/records", json={"records": [rec]}, headers=auth)
        assert r.status_code == 422, (bad, r.text)


def test_cuda_job_on_a_host_without_gpus_is_unschedulable(api: TestClient) -> None:
    r = api.post("/jobs", json={**DIGITS, "device": "cuda"})
    assert r.status_code == 422
    assert r.json()["message"] == "nproc_per_node: needs 2 GPUs; this host has 0"


def test_bad_metric_queries_are_422(api: TestClient) -> None:
    job_id = api.post("/jobs", json=DIGITS).json()["id"]
    for query in ("after=-1", "limit=0", "limit=100001", "rank=-2", "after=abc"):
        assert api.get(f"/jobs/{job_id}/metrics?{query}").status_code == 422, query
