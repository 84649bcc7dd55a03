"""A job must not be able to hurt the service (issue 17): what a job writes, prints, posts or leaves
behind is untrusted input, bounded and checked before it is stored or answered.

In-process tests drive the real app on a migrated SQLite file; the live ones run real script jobs
(torchrun, gloo, CPU) under a real server.
"""

from __future__ import annotations

import json
from pathlib import Path

from fastapi.testclient import TestClient

from service import repository as repo
from service.bounded import REASON_MAX_CHARS
from service.failure import describe_exit
from service.jobtoken import new_token

ONE_RANK = {"name": "hostile", "dataset": "digits", "epochs": 1, "nproc_per_node": 1}
EIGHT_MIB = 8 * 1024 * 1024


def _give_token(api: TestClient, job_id: int) -> dict[str, str]:
    """Put the job where a launched job is (starting, with a token), as the supervisor does."""
    token, digest = new_token()
    with api.app.state.session_factory() as session:
        assert repo.transition(session, job_id, repo.JobState.starting, token_hash=digest)
        session.commit()
    return {"authorization": f"Bearer {token}"}


def _set_attempts(api: TestClient, job_id: int, attempts: list[dict]) -> None:
    with api.app.state.session_factory() as session:
        repo.set_attempts(session, job_id, attempts)
        session.commit()


def _record(**fields: object) -> dict:
    return {"records": [{"rank": 0, "epoch": 1, "name": "loss", "value": 0.5, "time": 1.0,
                         **fields}]}


# --- finding 6: unbounded strings ----------------------------------------------------------------

def test_a_huge_rank_exception_makes_a_bounded_reason(tmp_path: Path) -> None:
    """What the shim makes of an 8 MiB exception in torch's error file (rank 0's own)."""
    logs = tmp_path / "logs"
    (logs / "run" / "attempt_0" / "0").mkdir(parents=True)
    message = "RuntimeError: " + "R" * EIGHT_MIB
    (logs / "run" / "attempt_0" / "0" / "error.json").write_text(
        json.dumps({"message": {"message": message}}))
    (logs / "torchrun.log").write_text("x" * 10_000_000 + "\n")  # one 10 MB line
    reason = describe_exit(1, logs, logs / "torchrun.log")
    assert len(reason) <= REASON_MAX_CHARS
    assert reason.startswith("rank 0 failed: RuntimeError: RRR")
    assert "the full text is in the job's logs" in reason and "exited with code 1" in reason
    tail_only = describe_exit(1, tmp_path / "none", logs / "torchrun.log")
    assert len(tail_only) <= REASON_MAX_CHARS


def test_job_reasons_and_attempt_reasons_are_stored_bounded(api: TestClient) -> None:
    ids = [api.post("/jobs", json=ONE_RANK).json()["id"] for _ in range(3)]
    huge = "R" * EIGHT_MIB
    with api.app.state.session_factory() as session:
        for job_id in ids:
            repo.set_attempts(session, job_id, [
                {"number": 1, "started_at": 1.0, "ended_at": 2.0, "exit_code": 1,
                 "reason": huge, "startup_failure": False}])
            assert repo.transition(session, job_id, repo.JobState.failed, reason=huge)
        session.commit()
    page = api.get("/jobs", params={"limit": 50})
    assert page.status_code == 200
    assert len(page.content) < 3 * 3 * REASON_MAX_CHARS + 10_000, "bounded whatever the job raised"
    job = page.json()["items"][0]
    assert len(job["reason"]) <= REASON_MAX_CHARS and "job's logs" in job["reason"]
    assert len(job["attempts"][0]["reason"]) <= REASON_MAX_CHARS


# --- finding 7: forged records -------------------------------------------------------------------

def test_records_of_ranks_or_attempts_the_job_does_not_have_are_refused(api: TestClient) -> None:
    job_id = api.post("/jobs", json=ONE_RANK).json()["id"]
    auth = _give_token(api, job_id)
    url = f"/jobs/{job_id}/records"

    forged_rank = api.post(url, json=_record(rank=65535, attempt=10000), headers=auth)
    assert forged_rank.status_code == 422
    assert "records.0.rank" in forged_rank.json()["message"]
    assert api.post(url, json=_record(rank=1), headers=auth).status_code == 422
    # Before the shim's first attempt is recorded, only attempt 1 can be running.
    early = api.post(url, json=_record(attempt=2), headers=auth)
    assert early.status_code == 422 and "records.0.attempt" in early.json()["message"]
    assert api.post(url, json=_record(), headers=auth).json() == {"accepted": 1, "duplicates": 0}

    # Attempt 1 running: attempt 2 is a forgery, refused, and cannot shadow the real one later.
    _set_attempts(api, job_id, [{"number": 1, "started_at": 1.0, "ended_at": None}])
    assert api.post(url, json=_record(attempt=2, value=99.0), headers=auth).status_code == 422
    # Attempt 1 ended, attempt 2 not recorded yet: retry shortly (the reporter retries 503s).
    _set_attempts(api, job_id, [{"number": 1, "started_at": 1.0, "ended_at": 2.0}])
    later = api.post(url, json=_record(attempt=2, value=0.25), headers=auth)
    assert later.status_code == 503 and later.headers["retry-after"] == "1"
    assert api.post(url, json=_record(attempt=3), headers=auth).status_code == 422
    _set_attempts(api, job_id, [{"number": 1, "started_at": 1.0, "ended_at": 2.0},
                                {"number": 2, "started_at": 2.0, "ended_at": None}])
    genuine = api.post(url, json=_record(attempt=2, value=0.25), headers=auth)
    assert genuine.json() == {"accepted": 1, "duplicates": 0}, "the real value is stored"

    items = api.get(f"/jobs/{job_id}/metrics").json()["items"]
    assert [(m["attempt"], m["rank"], m["value"]) for m in items] == [(1, 0, 0.5), (2, 0, 0.25)]
    summary = api.get(f"/jobs/{job_id}/metrics/summary").json()
    assert "65535" not in json.dumps(summary)
