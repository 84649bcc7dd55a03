"""A job must not be able to hurt the service (issue 17): what a job writes, prints, posts or leaves
behind is untrusted input, bounded and checked before it is stored or answered.

In-process tests drive the real app on a migrated SQLite file; the live ones run real script jobs
(torchrun, gloo, CPU) under a real server.
"""

import json
import os
import threading
import time
from pathlib import Path

from fastapi.testclient import TestClient
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from service.app import create_app
from service.domain.loop.finisher import Finisher
from service.executor.reference import encode_reference
from service.run.exitreason import describe_exit
from service.settings import Settings
from service.settings.tokens import new_token
from service.store import repository as repo
from service.store.tables import Job, MetricRecord
from torchyard_contract.bounds import REASON_MAX_CHARS
from torchyard_contract.rundir import RunDir
from torchyard_contract.runfiles import read_attempts, read_outcome

ONE_RANK = {"name": "hostile", "dataset": "digits", "epochs": 1, "nproc_per_node": 1}
EIGHT_MIB = 8 * 1024 * 1024


def stored_records(session: Session, job_id: int) -> int:
    """How many records the database holds for ``job_id``."""
    return session.scalar(select(func.count()).select_from(MetricRecord)
                          .where(MetricRecord.job_id == job_id)) or 0



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
    """What the attempt loop makes of an 8 MiB exception in torch's error file (rank 0's own)."""
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
    # Before the attempt loop's first attempt is recorded, only attempt 1 can be running.
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


# --- finding 1: files a job leaves where torchyard keeps its own -------------------------------

def _run(tmp_path: Path) -> RunDir:
    run = RunDir(tmp_path / "run")
    run.attempts_dir.mkdir(parents=True)
    run.spool_dir.mkdir()
    return run


def _attempt(number: int, ended: bool = True) -> str:
    return json.dumps({"number": number, "started_at": 1.0, "ended_at": 2.0 if ended else None,
                       "exit_code": 0 if ended else None, "reason": None,
                       "startup_failure": False if ended else None})


def test_only_attempt_files_torchyard_made_are_read(tmp_path: Path) -> None:
    run = _run(tmp_path)
    (run.attempts_dir / "results.json").write_text('{"best_lr": 0.1}')
    (run.attempts_dir / "1.json").write_text(_attempt(1, ended=False))
    (run.attempts_dir / "2.json").write_text('{"number": 2}')  # attempt 1 is still running
    assert [a["number"] for a in read_attempts(run)] == [1]
    (run.attempts_dir / "1.json").write_text(_attempt(1))
    assert [a["number"] for a in read_attempts(run)] == [1], "2.json is not a valid record"
    (run.attempts_dir / "2.json").write_text(_attempt(2))
    (run.attempts_dir / "3.json").write_text(_attempt(3))
    assert [a["number"] for a in read_attempts(run, max_attempts=2)] == [1, 2]
    (run.attempts_dir / "1.json").write_text(_attempt(1).replace('"number": 1', '"number": 7'))
    assert read_attempts(run) == [], "a record naming another attempt is refused"
    (run.attempts_dir / "1.json").unlink()
    os.mkfifo(run.attempts_dir / "1.json")
    started = time.monotonic()
    assert read_attempts(run) == [] and read_outcome(run) is None
    os.mkfifo(run.exit_file)
    assert read_outcome(run) is None
    assert time.monotonic() - started < 2, "a FIFO is never opened for a blocking read"
    run.exit_file.unlink()
    run.exit_file.write_text('{"state": "succeeded", "exit_code": "0"}')
    assert read_outcome(run) is None, "fields are validated strictly"
    run.exit_file.write_text('{"state": "failed", "exit_code": 1, "reason": "' + "x" * 9000 + '"}')
    outcome = read_outcome(run)
    assert outcome is not None and len(outcome.reason or "") <= REASON_MAX_CHARS


def _finisher(api: TestClient, max_records: int = 100_000) -> Finisher:
    return Finisher(runs_dir=api.app.state.settings.runs_dir,
                    session_factory=api.app.state.session_factory,
                    max_records_per_rank=max_records)


def _running_job(api: TestClient) -> tuple[int, RunDir, dict[str, str]]:
    """A launched job whose attempt 1 ended (its attempt loop is about to write the outcome)."""
    job_id = api.post("/jobs", json=ONE_RANK).json()["id"]
    auth = _give_token(api, job_id)
    run = RunDir.for_job(api.app.state.settings.runs_dir, job_id)
    run.attempts_dir.mkdir(parents=True)
    run.spool_dir.mkdir()
    (run.attempts_dir / "1.json").write_text(_attempt(1))
    _set_attempts(api, job_id, read_attempts(run))
    return job_id, run, auth


def test_stray_files_and_fifos_never_stop_finishing_a_job(api: TestClient) -> None:
    job_id, run, _ = _running_job(api)
    (run.attempts_dir / "results.json").write_text('{"best_lr": 0.1}')
    (run.attempts_dir / "2.json").write_text('{"number": 2}')
    os.mkfifo(run.spool_file(9))  # a rank the job does not have
    os.mkfifo(run.spool_file(0))  # its only rank's spool, not a regular file
    run.exit_file.write_text('{"state": "succeeded", "exit_code": 0, "reason": null}')
    started = time.monotonic()
    _finisher(api).finish(job_id, 0)
    assert time.monotonic() - started < 5
    job = api.get(f"/jobs/{job_id}").json()
    assert job["state"] == "succeeded" and [a["number"] for a in job["attempts"]] == [1]
    assert api.get("/jobs").status_code == 200


def test_an_unreadable_outcome_fails_the_job_saying_why(api: TestClient) -> None:
    job_id, run, _ = _running_job(api)
    run.exit_file.write_text('{"state": "won"}')
    _finisher(api).finish(job_id, 0)
    job = api.get(f"/jobs/{job_id}").json()
    assert job["state"] == "failed" and "without a readable outcome" in job["reason"]


def test_an_error_finishing_one_job_fails_it_and_the_next_is_finished(api: TestClient) -> None:
    bad, _, _ = _running_job(api)
    good, good_run, _ = _running_job(api)
    good_run.exit_file.write_text('{"state": "succeeded", "exit_code": 0}')
    # A fault no job can cause (a spec row the finisher cannot read) stands in for any error.
    with api.app.state.session_factory() as session:
        session.execute(update(Job).where(Job.id == bad).values(spec=[1]))  # not a mapping
        session.commit()
    finisher = _finisher(api)
    finisher.start()
    try:
        finisher.enqueue(bad, 0)
        finisher.enqueue(good, 0)
        deadline = time.monotonic() + 20
        while finisher.is_pending(bad) or finisher.is_pending(good):
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        finisher.stop()
    with api.app.state.session_factory() as session:  # (its spec no longer reads as a JobSpec)
        failed = repo.get_job(session, bad)
        assert failed is not None and failed.state == "failed"
        assert "could not finish" in (failed.reason or "")
        assert repo.allocated_resources(session) == {}
    assert api.get(f"/jobs/{good}").json()["state"] == "succeeded"


def test_the_server_starts_whatever_a_dead_job_left(tmp_path: Path) -> None:
    """A job that ended while the server was down, with stray files and FIFOs where torchyard
    keeps its own: the server starts, serves, and the job ends with a reason."""
    settings = Settings(home=tmp_path / "home", gpus="none", cpu_slots=2)
    first = create_app(settings, run_supervisor=False)
    with TestClient(first) as c:
        job_id = c.post("/jobs", json=ONE_RANK).json()["id"]
        _give_token(c, job_id)
        with first.state.session_factory() as session:
            repo.allocate(session, job_id, ["cpu:0"])
            # Launched (a stored reference) by an attempt loop long gone; without one, the recovery
            # would take it for a launch cut off before its attempt loop started (torchyard_contract.claim).
            job = repo.get_job(session, job_id)
            assert job is not None
            job.executor, job.executor_ref = "local", encode_reference(2**22 + 17, 1.0)
            session.commit()
    run = RunDir.for_job(settings.runs_dir, job_id)
    run.attempts_dir.mkdir(parents=True)
    run.spool_dir.mkdir()
    (run.attempts_dir / "results.json").write_text('{"best_lr": 0.1}')
    (run.attempts_dir / "2.json").write_text('{"number": 2}')
    os.mkfifo(run.spool_file(0))
    os.mkfifo(run.exit_file)
    started = time.monotonic()
    with TestClient(create_app(settings)) as c:  # the supervisor runs: recovery, then the loop
        deadline = time.monotonic() + 30
        while (job := c.get(f"/jobs/{job_id}").json())["state"] not in ("failed", "succeeded"):
            assert time.monotonic() < deadline, job
            time.sleep(0.1)
        assert job["state"] == "failed" and "no readable outcome" in job["reason"]
        assert c.get("/resources").json()["cpu"]["allocated"] == 0
        assert c.get("/jobs").status_code == 200
    assert time.monotonic() - started < 30


# --- finding 2: re-ingesting a big spool ----------------------------------------------------------

def _spool_lines(path: Path, count: int, rank: int = 0) -> None:
    line = '{"attempt": 1, "rank": %d, "epoch": 0, "step": %d, "name": "loss", "value": 0.5, "time": 1.0}\n'
    with path.open("w") as f:
        f.writelines(line % (rank, step) for step in range(count))


def test_a_big_spool_is_capped_batched_and_leaves_the_database_writable(api: TestClient) -> None:
    job_id, run, _ = _running_job(api)
    _spool_lines(run.spool_file(0), 200_000)
    run.exit_file.write_text('{"state": "succeeded", "exit_code": 0}')
    finisher = _finisher(api, max_records=40_000)
    worker = threading.Thread(target=finisher.finish, args=(job_id, 0))
    worker.start()
    waits = []
    while worker.is_alive():  # other writers get the lock between batches
        started = time.monotonic()
        assert api.post("/jobs", json=ONE_RANK).status_code == 201
        waits.append(time.monotonic() - started)
        time.sleep(0.05)
    worker.join()
    job = api.get(f"/jobs/{job_id}").json()
    assert job["state"] == "succeeded"
    with api.app.state.session_factory() as session:
        assert stored_records(session, job_id) == 40_000
    assert "rank 0: spool re-ingestion stopped after 40000 records" in job["reason"]
    assert str(run.spool_file(0)) in job["reason"]
    assert len(waits) >= 2 and max(waits) < 3, f"writes waited {max(waits):.1f} s"


def test_only_what_the_api_did_not_acknowledge_is_re_read(api: TestClient) -> None:
    job_id, run, _ = _running_job(api)
    _spool_lines(run.spool_file(0), 100_000)
    acked = run.spool_file(0).stat().st_size
    with run.spool_file(0).open("a") as f:
        f.write('{"attempt": 1, "rank": 0, "epoch": 3, "name": "loss", "value": 0.1, "time": 1.0}\n')
        f.write('{"attempt": 1, "rank": 1, "epoch": 3, "name": "loss", "value": 0.1, "time": 1.0}\n')
        f.write('{"attempt": 1, "rank": 0, "epoch": 4, "na')  # torn by a kill
    run.spool_ack_file(0).write_text(str(acked))
    run.exit_file.write_text('{"state": "succeeded", "exit_code": 0}')
    started = time.monotonic()
    _finisher(api).finish(job_id, 0)
    assert time.monotonic() - started < 5
    items = api.get(f"/jobs/{job_id}/metrics").json()["items"]
    assert [(m["rank"], m["epoch"]) for m in items] == [(0, 3)], "rank 1's line is not rank 0's"


def test_finishing_runs_off_the_supervisor_loop(api: TestClient) -> None:
    job_id, run, _ = _running_job(api)
    _spool_lines(run.spool_file(0), 60_000)
    run.exit_file.write_text('{"state": "succeeded", "exit_code": 0}')
    supervisor = api.app.state.supervisor
    assert supervisor.lease.renew()  # it acts only while it holds the lease (service.domain.lease)
    supervisor.finisher.start()
    try:
        supervisor.reaper.finish(job_id, 0)  # what the reap does when the attempt loop exits
        assert api.get("/resources").json()["cpu"]["allocated"] == 0, "slots free at once"
        started = time.monotonic()
        supervisor.tick()
        assert time.monotonic() - started < 2, "a tick does not wait for the spool"
        deadline = time.monotonic() + 60
        while (job := api.get(f"/jobs/{job_id}").json())["state"] != "succeeded":
            assert time.monotonic() < deadline, (
                job["state"], job["reason"], supervisor.finisher.is_pending(job_id),
                supervisor.finisher._thread and supervisor.finisher._thread.is_alive())
            time.sleep(0.1)
    finally:
        supervisor.finisher.stop()
    with api.app.state.session_factory() as session:
        assert stored_records(session, job_id) == 60_000


def test_shutdown_interrupts_finishing_and_the_next_start_completes_it(api: TestClient) -> None:
    job_id, run, _ = _running_job(api)
    _spool_lines(run.spool_file(0), 100_000)
    run.exit_file.write_text('{"state": "succeeded", "exit_code": 0}')
    finisher = _finisher(api)
    finisher.start()
    finisher.enqueue(job_id, 0)
    deadline = time.monotonic() + 60
    while True:  # until it is part way through the spool: its first chunks are stored
        with api.app.state.session_factory() as session:
            if stored_records(session, job_id):
                break
        assert time.monotonic() < deadline, "the finisher never stored a chunk"
        time.sleep(0.02)
    started = time.monotonic()
    finisher.stop()
    assert time.monotonic() - started < 3, "a restart does not wait for a spool"
    with api.app.state.session_factory() as session:
        assert 0 < stored_records(session, job_id) < 100_000, "it was stopped part way"
    assert api.get(f"/jobs/{job_id}").json()["state"] == "starting", "not terminal half-read"
    _finisher(api).finish(job_id, 0)  # what the next start's recovery does
    assert api.get(f"/jobs/{job_id}").json()["state"] == "succeeded"
    with api.app.state.session_factory() as session:
        assert stored_records(session, job_id) == 100_000, "re-reading is idempotent"


# --- finding 3: nothing is stored once a job is terminal ------------------------------------------

def test_terminal_then_empty_page_means_every_record_was_seen(api: TestClient) -> None:
    job_id, run, _ = _running_job(api)
    _spool_lines(run.spool_file(0), 5)
    run.exit_file.write_text('{"state": "succeeded", "exit_code": 0}')
    _finisher(api).finish(job_id, 0)
    page = api.get(f"/jobs/{job_id}/metrics").json()
    assert page["state"] == "succeeded" and len(page["items"]) == 5, "the spool before the end"
    # A cancelled job: a rank's last record (sent on SIGTERM) is refused, and the spool that
    # holds it is not read into a terminal job either.
    other, other_run, token = _running_job(api)
    assert api.post(f"/jobs/{other}/records", json=_record(epoch=1), headers=token).json() == {
        "accepted": 1, "duplicates": 0}
    api.post(f"/jobs/{other}/cancel")
    late = api.post(f"/jobs/{other}/records", json=_record(epoch=9), headers=token)
    assert late.status_code == 409 and "spool" in late.json()["message"]
    _spool_lines(other_run.spool_file(0), 3)
    other_run.exit_file.write_text('{"state": "cancelled", "exit_code": -15}')
    _finisher(api).finish(other, -15)
    events = api.get(f"/jobs/{other}/events").text
    assert events.count("event: metric") == 1 and "cancelled" in events
    assert [m["epoch"] for m in api.get(f"/jobs/{other}/metrics").json()["items"]] == [1]
    assert api.get(f"/jobs/{other}").json()["exit_code"] == -15
