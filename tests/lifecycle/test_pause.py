"""Pause and resume (issue 25, item 1) with real 2-rank torchrun groups on CPU/gloo: the built-in
trainer, a script using the SDK's ``worker.should_stop()``, and a script that only handles
SIGTERM. A paused job frees its slots, resumes from its checkpoint as a new attempt without
using a restart, and every (rank, epoch) is reported exactly once across attempts
(docs/lifecycle.md, "Pause and resume")."""

import json
import signal
import threading
import time
from collections import Counter

import httpx
import pytest
from fastapi.testclient import TestClient

from service.domain.loop.finisher import Finisher
from service.store import repository as repo
from tests.conftest import (
    LiveServer,
    add_script,
    cli,
    every_record,
    hooks,
)
from torchyard_contract.spec import JobSpec
from torchyard_contract.state import JobState

# The built-in trainer's epochs take 0.4 s more (tests/rankhooks): epochs to pause between.
BUILTIN = {"dataset": "synthetic", "labels": hooks(epoch_sleep_s=0.4)}

# Checkpoints with the SDK each epoch and stops where worker.should_stop() says.
SDK_SCRIPT = '''
import sys, time
import torch, torch.distributed as dist
import worker
from worker import checkpoint
dist.init_process_group("gloo")
state = checkpoint.load_latest()
start = state["epoch"] + 1 if state else 1
for epoch in range(start, int(sys.argv[1]) + 1):
    t = torch.tensor([float(epoch)])
    dist.all_reduce(t)
    time.sleep(0.4)
    worker.report(epoch=epoch, loss=1.0 / epoch)
    checkpoint.save({"seen": epoch}, epoch)
    if worker.should_stop():
        break
dist.destroy_process_group()
'''

# No should_stop(): its own SIGTERM handler, its own state file, its own agreement.
SIGTERM_SCRIPT = '''
import json, os, signal, sys, time
import torch, torch.distributed as dist
import worker
asked = []
signal.signal(signal.SIGTERM, lambda *_: asked.append(1))
dist.init_process_group("gloo")
rank = dist.get_rank()
path = os.path.join(os.environ["TORCHYARD_RUN_DIR"], "my-state.json")
start = json.load(open(path))["epoch"] + 1 if os.path.exists(path) else 1
for epoch in range(start, int(sys.argv[1]) + 1):
    time.sleep(0.4)
    worker.report(epoch=epoch, loss=1.0 / epoch)
    if rank == 0:
        with open(path + ".tmp", "w") as f:
            json.dump({"epoch": epoch}, f)
        os.replace(path + ".tmp", path)
    stop = torch.tensor([1 if asked else 0])
    dist.all_reduce(stop, op=dist.ReduceOp.MAX)
    if stop.item():
        sys.exit(0)
dist.destroy_process_group()
'''


@pytest.fixture
def server(shared_script_server: LiveServer) -> LiveServer:
    """The shared script server with this file's scripts (its built-in jobs sleep per epoch
    through the rank hooks' labels, ``BUILTIN``)."""
    add_script(shared_script_server, "sdk_pausable.py", SDK_SCRIPT)
    add_script(shared_script_server, "sigterm_pausable.py", SIGTERM_SCRIPT)
    return shared_script_server


def _epochs_seen(server: LiveServer, job_id: int) -> Counter:
    return Counter((r["rank"], r["epoch"]) for r in every_record(server, job_id)
                   if r["name"] == "loss")


def _wait_epochs(server: LiveServer, job_id: int, count: int) -> None:
    end = time.monotonic() + 120
    while sum(_epochs_seen(server, job_id).values()) < count:
        assert time.monotonic() < end, "the job reported too few epochs"
        time.sleep(0.2)


def _states_of(server: LiveServer, job_id: int, into: list[str]) -> threading.Thread:
    """Follow the job's event stream on a thread, collecting the states it sends."""
    def follow() -> None:
        headers = {"Authorization": f"Bearer {server.token}"}
        with httpx.Client(base_url=server.url, timeout=180, headers=headers) as c, \
                c.stream("GET", f"/jobs/{job_id}/events") as stream:
            event = None
            for line in stream.iter_lines():
                if line.startswith("event:"):
                    event = line.split(":", 1)[1].strip()
                elif line.startswith("data:") and event == "state":
                    into.append(json.loads(line.split(":", 1)[1])["state"])
    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    return thread


def _pause_resume_exactly_once(server: LiveServer, spec: dict, epochs: int) -> dict:
    states: list[str] = []
    with server.client() as c:
        posted = c.post("/jobs", json=spec)
        assert posted.status_code == 201, posted.text
        job_id = posted.json()["id"]
        follower = _states_of(server, job_id, states)
        server.wait_for(job_id, {"running"})
        _wait_epochs(server, job_id, 4)  # two epochs of both ranks
        paused = c.post(f"/jobs/{job_id}/pause")
        assert paused.status_code == 200, paused.text
        assert paused.json()["state"] in ("pausing", "paused")
        job = server.wait_for(job_id, {"paused"}, timeout_s=60, allowed={"pausing"})
        assert job["reason"] == "paused by user" and job["pauses"] == 1
        assert job["attempts"][-1]["paused"] is True
        items = c.get("/resources").json()["items"]
        assert len(items) == 4 and all(i["job_id"] != job_id for i in items), items
        # Its slots are free: a job needing all four runs while it is paused.
        other = c.post("/jobs", json={"dataset": "synthetic", "epochs": 1,
                                      "nproc_per_node": 4}).json()["id"]
        server.wait_for(other, {"succeeded"})
        assert c.get(f"/jobs/{job_id}").json()["state"] == "paused"
        resumed = c.post(f"/jobs/{job_id}/resume")
        assert resumed.status_code == 200 and resumed.json()["state"] == "queued"
        job = server.wait_for(job_id, {"succeeded"}, timeout_s=120)
    follower.join(timeout=30)
    seen = _epochs_seen(server, job_id)
    assert set(seen) == {(r, e) for r in (0, 1) for e in range(1, epochs + 1)}
    assert max(seen.values()) == 1, f"reported twice: {seen}"
    numbers = [a["number"] for a in job["attempts"]]
    assert numbers == list(range(1, len(numbers) + 1)) and len(numbers) == 2
    assert job["attempts"][0]["paused"] and not job["attempts"][1]["paused"]
    # The stream told of the pause and of the resumed run (a state shorter than one of its
    # polls may be skipped: docs/metrics.md).
    assert "paused" in states and states[-1] == "succeeded", states
    after = states[states.index("paused") + 1:-1]
    assert after and set(after) <= {"queued", "starting", "running"}, states
    return job


def test_pause_and_resume_the_builtin_trainer(server: LiveServer) -> None:
    # checkpoint_every 3: the pause still checkpoints the epoch it stopped after.
    spec = {**BUILTIN, "epochs": 7, "nproc_per_node": 2, "checkpoint_every": 3,
            "max_restarts": 0}
    _pause_resume_exactly_once(server, spec, 7)


@pytest.mark.parametrize("script", ["sdk_pausable.py", "sigterm_pausable.py"])
def test_pause_and_resume_a_script(server: LiveServer, script: str) -> None:
    spec = {"entrypoint": script, "args": ["7"], "nproc_per_node": 2}
    _pause_resume_exactly_once(server, spec, 7)


def test_a_queued_job_pauses_at_once_and_waits_for_resume(server: LiveServer) -> None:
    with server.client() as c:
        blocker = c.post("/jobs", json={**BUILTIN, "epochs": 50,
                                        "nproc_per_node": 4}).json()["id"]
        server.wait_for(blocker, {"running"})
        waiting = c.post("/jobs", json={"dataset": "synthetic", "epochs": 1}).json()["id"]
        paused = cli(server, "pause", str(waiting), env={"TORCHYARD_TOKEN": server.token or ""})
        assert paused.returncode == 0 and "paused" in paused.stdout, paused.stderr
        job = c.get(f"/jobs/{waiting}").json()
        assert job["state"] == "paused" and job["attempts"] == []
        assert c.post(f"/jobs/{waiting}/pause").json()["state"] == "paused"  # unchanged
        c.post(f"/jobs/{blocker}/cancel")
        server.wait_for(blocker, {"cancelled"}, allowed={"running"})
        later = c.post("/jobs", json={"dataset": "synthetic", "epochs": 1}).json()["id"]
        server.wait_for(later, {"succeeded"})  # a pass ran with free slots: still paused
        assert c.get(f"/jobs/{waiting}").json()["state"] == "paused"
        resumed = cli(server, "resume", str(waiting), env={"TORCHYARD_TOKEN": server.token or ""})
        assert resumed.returncode == 0 and "queued" in resumed.stdout, resumed.stderr
        job = server.wait_for(waiting, {"succeeded"})
        assert [a["number"] for a in job["attempts"]] == [1] and job["pauses"] == 1


def test_pause_and_resume_refuse_other_states(server: LiveServer) -> None:
    with server.client() as c:
        done = c.post("/jobs", json={"dataset": "synthetic", "epochs": 1}).json()["id"]
        server.wait_for(done, {"succeeded"})
        refused = c.post(f"/jobs/{done}/pause")
        assert refused.status_code == 409
        assert "succeeded" in refused.text and "queued, starting or running" in refused.text
        resumed = c.post(f"/jobs/{done}/resume")
        assert resumed.status_code == 409 and "only a paused job" in resumed.text
        assert c.post("/jobs/999999/pause").status_code == 404
    refused_cli = cli(server, "pause", str(done), env={"TORCHYARD_TOKEN": server.token or ""})
    assert refused_cli.returncode == 5 and "409" in refused_cli.stderr


# SQLite: the pause's compare-and-sets run on both stores in tests/store/test_store.py, a
# restart's recovery on PostgreSQL in tests/run/test_fault.py (the one restart twin).
def test_a_job_pausing_across_a_server_kill_is_paused_and_resumes(live_server_factory) -> None:  # type: ignore[no-untyped-def]
    server = live_server_factory()
    spec = {**BUILTIN, "epochs": 6, "nproc_per_node": 2}
    with server.client() as c:
        job_id = c.post("/jobs", json=spec).json()["id"]
        server.wait_for(job_id, {"running"})
        _wait_epochs(server, job_id, 2)
        assert c.post(f"/jobs/{job_id}/pause").json()["state"] == "pausing"
    # Killed while pausing (maybe before its loop asked the job's attempt loop): the next server
    # adopts the job, asks again if need be, and finishes it as paused.
    server.proc.send_signal(signal.SIGKILL)
    server.proc.wait()
    again = live_server_factory(server.home, server.port)
    again.wait_for(job_id, {"paused"}, timeout_s=60, allowed={"pausing"})
    with again.client() as c:
        assert c.post(f"/jobs/{job_id}/resume").json()["state"] == "queued"
    job = again.wait_for(job_id, {"succeeded"}, timeout_s=120)
    assert [a["paused"] for a in job["attempts"]] == [True, False]
    seen = _epochs_seen(again, job_id)
    assert set(seen) == {(r, e) for r in (0, 1) for e in range(1, 7)} and max(seen.values()) == 1


def test_a_users_pause_of_a_preempted_job_is_not_undone_by_the_preemptions_resume(api) -> None:  # type: ignore[no-untyped-def]
    """In process, the supervisor's loop not running: the states as the routes leave them."""
    job_id = api.post("/jobs", json={"dataset": "synthetic", "epochs": 1}).json()["id"]
    with api.app.state.session_factory() as session:
        assert repo.transition(session, job_id, JobState.starting)
        assert repo.transition(session, job_id, JobState.running)
        assert repo.transition(session, job_id, JobState.pausing, reason="preempted by job 9",
                               preempted_by=9)
        session.commit()
    job = api.post(f"/jobs/{job_id}/pause").json()
    assert job["state"] == "pausing" and job["reason"] == "paused by user"
    assert job["preempted_by"] is None
    with api.app.state.session_factory() as session:
        assert repo.preempted_and_paused(session) == []
    assert api.post(f"/jobs/{job_id}/resume").status_code == 409  # once it is paused


class _ResumedMeanwhile(Finisher):
    """A finisher whose job is resumed between its first transaction and its last (what a user's
    resume right after a pause-while-pending races with on Slurm)."""

    def _end(self, job_id: int, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        with self.session_factory() as s:
            assert repo.transition(s, job_id, JobState.queued, reason=None, executor_ref=None,
                                   only_from=JobState.paused)
            s.commit()
        super()._end(job_id, *args, **kwargs)


def test_a_withdrawn_submission_ending_after_a_resume_leaves_the_job_queued(
    api: TestClient,
) -> None:
    sessions = api.app.state.session_factory
    with sessions() as s:
        job_id = repo.create_job(s, JobSpec.model_validate({"dataset": "synthetic"}), None).id
        repo.set_executor_ref(s, job_id, "slurm", "4242")  # pending in Slurm's queue
        assert repo.transition(s, job_id, JobState.paused, reason="paused by user",
                               only_from=JobState.queued)
        s.commit()
    finisher = _ResumedMeanwhile(runs_dir=api.app.state.settings.runs_dir,
                                 session_factory=sessions, max_records_per_rank=1000)
    finisher.finish(job_id, None, "CANCELLED (exit 0:0)", cancelled=True, ref="4242")
    job = api.get(f"/jobs/{job_id}").json()
    assert (job["state"], job["reason"], job["ended_at"]) == ("queued", None, None)
