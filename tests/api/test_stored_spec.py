"""A job stored under older, looser spec rules stays readable (issue 27, item 5).

The rules of ``JobSpec`` apply to what is submitted; a row accepted before a rule existed must
still read (``GET /jobs/{id}``, the list, the event stream's state), showing the spec as stored.
"""

from fastapi.testclient import TestClient
from sqlalchemy import update

from service.store.tables import Job

DIGITS = {"name": "old-rules", "model": "mlp", "dataset": "digits", "epochs": 1}


def _store_as_older_rules_allowed(api: TestClient, job_id: int, **spec: object) -> None:
    factory = api.app.state.session_factory  # type: ignore[attr-defined]
    with factory() as session:
        stored = session.get(Job, job_id).spec  # type: ignore[union-attr]
        session.execute(update(Job).where(Job.id == job_id).values(spec={**stored, **spec}))
        session.commit()


def test_a_spec_a_later_rule_refuses_still_reads(api: TestClient) -> None:
    job = api.post("/jobs", json=DIGITS).json()
    # PATH became reserved in `env` (issue 23), and epochs has an upper bound today.
    _store_as_older_rules_allowed(api, job["id"], env={"PATH": "/opt/bin"}, epochs=10**9)
    assert api.post("/jobs", json={**DIGITS, "env": {"PATH": "/x"}}).status_code == 422

    r = api.get(f"/jobs/{job['id']}")
    assert r.status_code == 200, r.text
    assert r.json()["spec"]["env"] == {"PATH": "/opt/bin"}
    assert r.json()["spec"]["epochs"] == 10**9
    listed = api.get("/jobs").json()["items"]
    assert [j["spec"]["epochs"] for j in listed if j["id"] == job["id"]] == [10**9]
    assert api.post(f"/jobs/{job['id']}/cancel").json()["state"] == "cancelled"
