"""``retry_elsewhere``'s parts that need no cluster (docs/lifecycle.md, "Retry rules"): the
outcome file's node names, the attempt loop finding the failing rank's node, its attempt count
across allocations, and the finisher queueing the job again on a real migrated store. The whole
path on a real Slurm cluster: ``tests/slurm/test_slurm.py``."""

import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from service.domain.loop.finisher import Finisher
from service.run import retrydecision
from service.run.attemptloop import AttemptLoop
from service.run.launcher import SlurmLauncher
from service.store import outbox
from service.store import repository as repo
from tests.conftest import both_stores
from torchyard_contract.launch import LaunchConfig
from torchyard_contract.nodes import EXCLUDE_NODES_MAX
from torchyard_contract.rundir import RunDir
from torchyard_contract.runfiles import OUTCOME_NODES_MAX, read_attempts, read_outcome
from torchyard_contract.spec import JobSpec
from torchyard_contract.state import JobState

ELSEWHERE = [{"exit_codes": [3], "action": "retry_elsewhere"}]


def _config(**fields: object) -> LaunchConfig:
    base: dict = dict(job_id=1, python="python", nproc_per_node=2, nnodes=2, max_restarts=1,
                      max_runtime_s=None, heartbeat_timeout_s=None, stop_grace_s=1.0,
                      on_failure=ELSEWHERE)
    return LaunchConfig(**{**base, **fields})


def _failed_attempt(run: RunDir, number: int, rank_codes: dict[str, int]) -> None:
    run.attempts_dir.mkdir(parents=True, exist_ok=True)
    run.attempt_file(number).write_text(json.dumps({
        "number": number, "started_at": 1.0, "ended_at": 2.0, "exit_code": 1,
        "reason": "a rank failed", "startup_failure": False, "rank_exit_codes": rank_codes}))


def _node_file(run: RunDir, attempt: int, node: int, text: str) -> None:
    path = run.node_name_file(attempt, node)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _outcome(tmp_path: Path, body: dict) -> object:
    run = RunDir(tmp_path)
    run.exit_file.write_text(json.dumps(body))
    return read_outcome(run)


@pytest.mark.parametrize("nodes", [["n1"], ["gpu-07.cluster", "n_2"], []])
def test_a_requeue_outcome_with_node_names_is_read(tmp_path: Path, nodes: list[str]) -> None:
    outcome = _outcome(tmp_path, {"state": "requeue", "exit_code": 3, "reason": "r",
                                  "exclude_nodes": nodes})
    assert outcome is not None and outcome.state == "requeue"  # type: ignore[attr-defined]
    assert outcome.exclude_nodes == nodes  # type: ignore[attr-defined]


@pytest.mark.parametrize("nodes", [
    ["n[1-2]"], ["n1,n2"], ["n1 --uid=0"], ["n1\n#SBATCH --uid=0"], [""], ["-n1"], [7],
    ["x" * 200], [f"n{i}" for i in range(OUTCOME_NODES_MAX + 1)], "n1",
])
def test_a_requeue_outcome_with_anything_else_is_no_outcome(tmp_path: Path, nodes: object) -> None:
    assert _outcome(tmp_path, {"state": "requeue", "exit_code": 3, "exclude_nodes": nodes}) is None


def test_retry_elsewhere_names_the_failing_ranks_node(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    # Rank 2 exited 3 first; rank 0 was stopped by torchrun. 2 ranks per node: rank 2 is node 1.
    _failed_attempt(run, 1, {"0": -15, "2": 3})
    _node_file(run, 1, 0, "n1\n")
    _node_file(run, 1, 1, "n2\n")
    decided = retrydecision.decide_attempt(run, _config(), 1, "a rank failed", elsewhere=True)
    assert decided.retry and decided.decision.excluded_node == "n2"
    assert decided.decision.summary == "restarted elsewhere: rank 2 exited with code 3 (rule 1); " \
        "excluding node n2"
    [attempt] = read_attempts(run)
    assert attempt["decision"]["action"] == "retry_elsewhere"
    assert attempt["decision"]["excluded_node"] == "n2" and attempt["decision"]["rank"] == 2


@pytest.mark.parametrize("written", [None, "n1 --uid=0\n", "n[1-2]\n"])
def test_an_unknown_node_is_a_retry_in_place_saying_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], written: str | None
) -> None:
    run = RunDir(tmp_path)
    _failed_attempt(run, 1, {"1": 3})
    if written is not None:
        _node_file(run, 1, 0, written)
    decided = retrydecision.decide_attempt(run, _config(nnodes=1), 1, "x", elsewhere=True)
    assert decided.retry and decided.decision.excluded_node is None
    assert decided.decision.summary.startswith("restarted in place: rank 1 exited with code 3 (rule 1)")
    assert "restarting in place" in capsys.readouterr().out  # the attempt loop's log says why
    [attempt] = read_attempts(run)
    assert attempt["decision"]["action"] == "retry_elsewhere"
    assert attempt["decision"]["excluded_node"] is None


def test_retry_elsewhere_stays_in_place_where_no_node_can_be_left_out(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    _failed_attempt(run, 1, {"0": 3})
    _node_file(run, 1, 0, "n1\n")
    local = retrydecision.decide_attempt(run, _config(nnodes=1), 1, "x", elsewhere=False)
    assert local.retry and local.decision.excluded_node is None
    assert local.decision.summary == "restarted: rank 0 exited with code 3 (rule 1)"
    # max_restarts used up: no restart, so no node is excluded either.
    used_up = retrydecision.decide_attempt(run, _config(nnodes=1, max_restarts=0), 1, "x",
                                           elsewhere=True)
    assert not used_up.retry and used_up.decision.excluded_node is None


def test_the_next_allocation_counts_a_requeued_attempt_as_a_failure(tmp_path: Path) -> None:
    """The attempt loop of the job's next allocation numbers on and counts the attempt a
    requeue ended against max_restarts (unlike one a pause ended)."""
    run = RunDir(tmp_path)
    _failed_attempt(run, 1, {"0": 3})
    record = json.loads(run.attempt_file(1).read_text())
    record["decision"] = {"action": "retry_elsewhere", "rule": "1", "rank": 0,
                          "excluded_node": "n1"}
    run.attempt_file(1).write_text(json.dumps(record))
    loop = AttemptLoop(run, _config(nnodes=1), SlurmLauncher())
    assert (loop.first_number, loop.paused_attempts) == (2, 0)


# --- the server side: the finisher on a real migrated store (the app's own) -------------------


def _finisher(api: TestClient, excludes_nodes: bool = True) -> Finisher:
    return Finisher(runs_dir=api.app.state.settings.runs_dir,
                    session_factory=api.app.state.session_factory, max_records_per_rank=1000,
                    excludes_nodes=excludes_nodes)


def _launched(api: TestClient, state: JobState = JobState.running,
              webhooks: dict | None = None) -> tuple[int, RunDir]:
    """A job as a Slurm launch leaves it: submitted, its attempt 1 failed and decided."""
    sessions: sessionmaker[Session] = api.app.state.session_factory
    with sessions() as s:
        job_id = repo.create_job(s, JobSpec.model_validate(
            {"dataset": "synthetic", "max_restarts": 2, "on_failure": ELSEWHERE}), None,
            webhooks).id
        assert repo.transition(s, job_id, JobState.starting)
        repo.set_executor_ref(s, job_id, "slurm", "4242")
        if state is not JobState.starting:
            assert repo.transition(s, job_id, JobState.running)
        if state is JobState.pausing:
            assert repo.transition(s, job_id, JobState.pausing, reason="paused by user")
        s.commit()
    run = RunDir.for_job(api.app.state.settings.runs_dir, job_id)
    _failed_attempt(run, 1, {"0": 3})
    return job_id, run


def _requeue(run: RunDir, *nodes: str) -> None:
    run.exit_file.write_text(json.dumps({
        "state": "requeue", "exit_code": 3, "exclude_nodes": list(nodes),
        "reason": f"restarted elsewhere: rank 0 exited with code 3 (rule 1); excluding node "
                  f"{nodes[0] if nodes else '?'}"}))


@pytest.mark.parametrize("state", [JobState.running, JobState.starting])
def test_a_requeue_outcome_queues_the_job_again_without_the_node(
    api: TestClient, state: JobState
) -> None:
    job_id, run = _launched(api, state)
    _requeue(run, "n2")
    _finisher(api).finish(job_id, 3, ref="4242")
    job = api.get(f"/jobs/{job_id}").json()
    assert job["state"] == "queued" and job["ended_at"] is None
    assert job["exclude_nodes"] == ["n2"]
    assert job["reason"] == ("restarted elsewhere: rank 0 exited with code 3 (rule 1); "
                             "excluding node n2")
    with api.app.state.session_factory() as s:
        row = repo.get_job(s, job_id)
        assert row is not None and row.executor_ref is None  # the scheduler submits it anew
        assert [j.id for j in repo.queued_unsubmitted(s)] == [job_id]

    # Its next allocation fails on another node: both stay excluded, in order, once each.
    with api.app.state.session_factory() as s:
        assert repo.transition(s, job_id, JobState.starting)
        repo.set_executor_ref(s, job_id, "slurm", "4243")
        s.commit()
    _requeue(run, "n1", "n2")
    _finisher(api).finish(job_id, 3, ref="4243")
    job = api.get(f"/jobs/{job_id}").json()
    assert job["state"] == "queued" and job["exclude_nodes"] == ["n2", "n1"]


@both_stores  # the decision as the JSON of the attempts, the requeue's compare-and-set
def test_the_decision_the_attempt_loop_wrote_is_stored_with_the_requeue(api: TestClient) -> None:
    """The run side's decision (``retrydecision``, into ``attempts/1.json``) as the finisher
    stores it and the API reads it back, with the job queued again without the node."""
    job_id, run = _launched(api)
    _node_file(run, 1, 0, "n1\n")
    decided = retrydecision.decide_attempt(run, _config(job_id=job_id, nnodes=1), 1,
                                           "a rank failed", elsewhere=True)
    assert decided.retry and decided.decision.excluded_node == "n1"
    _requeue(run, "n1")
    _finisher(api).finish(job_id, 3, ref="4242")
    job = api.get(f"/jobs/{job_id}").json()
    assert job["state"] == "queued" and job["exclude_nodes"] == ["n1"], job
    [attempt] = job["attempts"]
    assert attempt["decision"] == {
        "action": "retry_elsewhere", "rule": "1", "rank": 0, "cause": "rank 0 exited with code 3",
        "summary": decided.decision.summary, "backoff_s": 0.0, "excluded_node": "n1",
    }, attempt


def test_a_requeue_of_a_job_being_paused_pauses_it_keeping_the_exclusion(
    api: TestClient,
) -> None:
    job_id, run = _launched(api, JobState.pausing)
    _requeue(run, "n1")
    _finisher(api).finish(job_id, 3, ref="4242")
    job = api.get(f"/jobs/{job_id}").json()
    assert job["state"] == "paused" and job["reason"] == "paused by user"
    assert job["exclude_nodes"] == ["n1"] and job["pauses"] == 1


def test_a_requeue_outcome_where_no_node_can_be_left_out_fails_the_job(api: TestClient) -> None:
    """The local executor never writes ``requeue``: one there is the job's own output."""
    job_id, run = _launched(api)
    _requeue(run, "n1")
    _finisher(api, excludes_nodes=False).finish(job_id, 3)
    job = api.get(f"/jobs/{job_id}").json()
    assert job["state"] == "failed" and job["exclude_nodes"] == []
    assert job["reason"].startswith("the job's outcome asks for a restart on another node"), job


def test_a_requeue_naming_no_node_or_too_many_fails_the_job(api: TestClient) -> None:
    job_id, run = _launched(api)
    _requeue(run)
    _finisher(api).finish(job_id, 3)
    job = api.get(f"/jobs/{job_id}").json()
    assert job["state"] == "failed" and "names no node" in job["reason"], job

    job_id, run = _launched(api)
    with api.app.state.session_factory() as s:
        row = repo.get_job(s, job_id)
        assert row is not None
        row.exclude_nodes = [f"n{i}" for i in range(EXCLUDE_NODES_MAX)]
        s.commit()
    _requeue(run, "one-more")
    _finisher(api).finish(job_id, 3)
    job = api.get(f"/jobs/{job_id}").json()
    assert job["state"] == "failed", job
    assert job["reason"].startswith(f"not restarted elsewhere: it would exclude "
                                    f"{EXCLUDE_NODES_MAX + 1} nodes"), job


def test_a_requeued_job_is_announced_as_restarted_once_not_as_paused(api: TestClient) -> None:
    subscribed = {"ci": ["running", "paused", "restarted", "failed", "succeeded"]}
    job_id, run = _launched(api, webhooks=subscribed)
    sessions: sessionmaker[Session] = api.app.state.session_factory
    _requeue(run, "n1")
    _finisher(api).finish(job_id, 3, ref="4242")
    with sessions() as s:  # the next allocation: attempt 2 starts, then runs
        assert repo.transition(s, job_id, JobState.starting)
        first = read_attempts(run)
        repo.set_attempts(s, job_id, [*first, {"number": 2, "started_at": 3.0}])
        assert repo.transition(s, job_id, JobState.running)
        s.commit()
    with sessions() as s:
        events = [d.event for d in outbox.job_deliveries(s, job_id)]
        restarted = [json.loads(d.body)["data"] for d in outbox.job_deliveries(s, job_id)
                     if d.event == "restarted"]
    assert events == ["running", "restarted", "running"]
    assert [r["attempt"] for r in restarted] == [2]
