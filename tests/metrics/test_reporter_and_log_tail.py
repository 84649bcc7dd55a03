"""How a rank's reports reach the server, and a log read from its tail (issue 17, finding 9): the
URL ranks report to (an IPv6 host in brackets), metric names the SDK refuses at report time, the
reporter's acknowledged offset (the server re-reads only the rest), and log tails that start on a
character boundary."""

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from service.app import create_app
from service.domain.loop.finisher import Finisher
from service.settings import Settings
from service.settings.tokens import new_token
from service.store import repository as repo
from tests.fixtures.threadserver import serve_in_thread
from torchyard_contract.rundir import RunDir
from worker.env import WorkerEnv
from worker.reporter import Reporter


def test_ranks_get_a_bracketed_url_for_an_ipv6_host(tmp_path: Path) -> None:
    def url(**kw: object) -> str:
        return Settings(home=tmp_path, gpus="none", cpu_slots=1, **kw).api_url_for_ranks()

    assert url(host="::1", port=8123) == "http://[::1]:8123"
    assert url(host="fe80::1%eth0", port=1) == "http://[fe80::1%eth0]:1"
    assert url(host="::", port=8000) == "http://127.0.0.1:8000"
    assert url(host="0.0.0.0", port=8000) == "http://127.0.0.1:8000"
    assert url(host="127.0.0.1", port=9) == "http://127.0.0.1:9"
    assert url(host="gpu-box.lan", port=9) == "http://gpu-box.lan:9"
    assert url(host="::1", public_url="http://[::1]:1/") == "http://[::1]:1"


def test_logs_can_start_at_the_tail_on_a_character_boundary(api: TestClient) -> None:
    job_id = api.post("/jobs", json={"name": "t", "dataset": "digits", "epochs": 1,
                                     "nproc_per_node": 1}).json()["id"]
    with api.app.state.session_factory() as session:
        repo.set_attempts(session, job_id, [{"number": 1, "started_at": 1.0, "ended_at": 2.0,
                                             "exit_code": 0, "reason": None,
                                             "startup_failure": False}])
        session.commit()
    runs = api.app.state.settings.runs_dir
    folder = RunDir.for_job(runs, job_id).logs_dir / "attempt-1/run/attempt_0/0"
    folder.mkdir(parents=True)
    data = ("é" * 1000 + "END\n").encode()  # 2-byte characters: most offsets split one
    (folder / "stderr.log").write_bytes(data)

    tail = api.get(f"/jobs/{job_id}/logs", params={"tail": 11}).json()
    assert tail["text"] == "éééEND\n" and tail["offset"] == len(data) - 10
    assert tail["next_offset"] == len(data)
    whole = api.get(f"/jobs/{job_id}/logs", params={"tail": 1024 * 1024}).json()
    assert whole["offset"] == 0 and whole["text"] == data.decode()
    mid = api.get(f"/jobs/{job_id}/logs", params={"offset": 5, "limit": 4}).json()
    assert mid["offset"] == 6 and mid["text"] == "éé", "an offset inside a character moves on"
    both = api.get(f"/jobs/{job_id}/logs", params={"tail": 10, "offset": 3}).json()
    assert both["offset"] == len(data) - 10, "tail wins over offset"
    # A job can put a FIFO where its log goes: read, it would hold a server thread for good.
    (folder / "stdout.log").unlink(missing_ok=True)
    os.mkfifo(folder / "stdout.log")
    fifo = api.get(f"/jobs/{job_id}/logs", params={"stream": "stdout", "offset": 3}, timeout=5)
    assert fifo.status_code == 200 and fifo.json()["text"] == ""
    dangling = folder.parents[1] / "run2/attempt_0/0"
    dangling.mkdir(parents=True)
    (dangling / "stderr.log").symlink_to(folder / "nowhere")
    assert api.get(f"/jobs/{job_id}/logs").status_code == 200, "no 500 on a dangling link"


def test_the_sdk_refuses_a_bad_metric_name_at_report_time(tmp_path: Path) -> None:
    reporter = Reporter(WorkerEnv.from_environ({"TORCHYARD_RUN_DIR": str(tmp_path)}))
    with pytest.raises(ValueError, match=r"name 'val loss' is not accepted"):
        reporter.report(epoch=1, loss=0.5, **{"val loss": 0.7})
    with pytest.raises(ValueError, match=r"epoch -1 is not accepted"):
        reporter.report(epoch=-1, loss=0.5)
    reporter.report(epoch=1, loss=0.5, val_loss=0.7)
    reporter.close()
    lines = RunDir(tmp_path).spool_file(0).read_text().splitlines()
    assert [json.loads(line)["name"] for line in lines] == ["loss", "val_loss"], (
        "nothing of a refused call is spooled (or sent)")


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, FastAPI]]:
    """The real app under uvicorn in a thread (supervisor off)."""
    app = create_app(Settings(home=tmp_path / "home", gpus="none", cpu_slots=2),
                     run_supervisor=False)
    with serve_in_thread(app) as running:
        yield running.url, app


def test_the_reporter_acks_and_the_server_rereads_only_the_rest(
    served: tuple[str, FastAPI],
) -> None:
    url, app = served
    with httpx.Client(base_url=url, timeout=10) as c:
        job_id = c.post("/jobs", json={"name": "ack", "dataset": "digits", "epochs": 1,
                                       "nproc_per_node": 1}).json()["id"]
    token, digest = new_token()
    with app.state.session_factory() as session:
        repo.transition(session, job_id, repo.JobState.starting, token_hash=digest)
        session.commit()
    run = RunDir.for_job(app.state.settings.runs_dir, job_id)
    reporter = Reporter(WorkerEnv.from_environ({
        "TORCHYARD_API_URL": url, "TORCHYARD_JOB_ID": str(job_id), "TORCHYARD_JOB_TOKEN": token,
        "TORCHYARD_RUN_DIR": str(run.root)}))
    for epoch in range(1, 4):
        reporter.report(epoch=epoch, loss=1 / epoch)
    reporter.close(timeout_s=10)
    spool = run.spool_file(0)
    assert run.spool_ack_file(0).read_text() == str(spool.stat().st_size), "all answered"
    with spool.open("a") as f:  # one record the API never heard of
        f.write(json.dumps({"attempt": 1, "rank": 0, "epoch": 4, "name": "loss", "value": 0.2,
                            "time": time.time()}) + "\n")
    run.attempts_dir.mkdir(parents=True, exist_ok=True)
    run.attempt_file(1).write_text(json.dumps({"number": 1, "started_at": 1.0, "ended_at": 2.0}))
    run.exit_file.write_text('{"state": "succeeded", "exit_code": 0}')
    finisher = Finisher(runs_dir=app.state.settings.runs_dir,
                        session_factory=app.state.session_factory, max_records_per_rank=1)
    finisher.finish(job_id, 0)  # a cap of 1 record: enough, because only the rest is read
    with httpx.Client(base_url=url, timeout=10) as c:
        job = c.get(f"/jobs/{job_id}").json()
        epochs = [m["epoch"] for m in c.get(f"/jobs/{job_id}/metrics").json()["items"]]
    assert job["state"] == "succeeded" and job["reason"] is None
    assert epochs == [1, 2, 3, 4]
