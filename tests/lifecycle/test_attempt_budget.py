"""One restart budget and one world size (``torchyard_contract.attempts``), as the attempt loop
and the server both use them: an attempt a pause ended uses no restart on either side."""

import json
from pathlib import Path

import pytest

from service.domain.records.scope import job_attempts
from service.run.attemptloop import AttemptLoop
from torchyard_contract.attempts import AttemptBudget, spec_world_size, world_size
from torchyard_contract.launch import LaunchConfig
from torchyard_contract.rundir import RunDir


def test_world_size_is_nodes_times_ranks_per_node() -> None:
    assert world_size(3, 4) == 12
    config = LaunchConfig(job_id=1, python="python", nproc_per_node=4, nnodes=3, max_restarts=0,
                          max_runtime_s=None, heartbeat_timeout_s=None, stop_grace_s=1.0)
    assert config.world_size == spec_world_size({"nproc_per_node": 4, "nnodes": 3}) == 12


@pytest.mark.parametrize(("spec", "ranks"), [
    ({"nproc_per_node": 2}, 2),  # nnodes absent: one node
    ({"nproc_per_node": 2, "nnodes": None}, 2),
    ({"nproc_per_node": 0, "nnodes": 2}, 2),  # at least one rank per node
    ({"nproc_per_node": "many"}, 1),  # a stored spec from before strict validation
    ({}, 1),
    (None, 1),
])
def test_a_stored_specs_world_size_is_at_least_one(spec: dict | None, ranks: int) -> None:
    assert spec_world_size(spec) == ranks


def test_the_budget_counts_failures_not_pauses() -> None:
    budget = AttemptBudget(max_restarts=2, pauses=1)
    assert budget.attempts_max == 4  # 3 that may fail, 1 a pause ended
    assert budget.failures(4) == 3
    assert budget.allows_restart(2) and not budget.allows_restart(3)
    assert AttemptBudget(max_restarts=0).attempts_max == 1
    assert not AttemptBudget(max_restarts=0).allows_restart(1)


@pytest.mark.parametrize(("spec", "pauses", "attempts_max"), [
    ({"max_restarts": 3}, 0, 4),
    ({"max_restarts": 3}, 2, 6),
    ({}, 0, 1),
    ({"max_restarts": None}, 1, 2),
    ({"max_restarts": "three"}, 0, 1),  # not a number: no restart, as before
    (None, -1, 1),  # never fewer attempts than one
])
def test_a_stored_specs_budget(spec: dict | None, pauses: int, attempts_max: int) -> None:
    assert AttemptBudget.of_spec(spec, pauses).attempts_max == attempts_max


def _attempt(run: RunDir, number: int, *, paused: bool = False) -> None:
    run.attempts_dir.mkdir(parents=True, exist_ok=True)
    record = {"number": number, "started_at": 1.0, "ended_at": 2.0, "exit_code": 1,
              "reason": "paused" if paused else "a rank failed", "startup_failure": False}
    if paused:
        record["paused"] = True
    run.attempt_file(number).write_text(json.dumps(record))


def test_both_sides_see_one_budget_across_a_pause(tmp_path: Path) -> None:
    """max_restarts 2: attempt 1 failed, attempt 2 was paused, attempt 3 failed. The resumed
    attempt loop has used one restart (attempt 4 may run, and is the last); the server reads
    all four attempts of a job paused once, and no fifth."""
    run = RunDir(tmp_path)
    _attempt(run, 1)
    _attempt(run, 2, paused=True)
    _attempt(run, 3)
    config = LaunchConfig(job_id=1, python="python", nproc_per_node=1, max_restarts=2,
                          max_runtime_s=None, heartbeat_timeout_s=None, stop_grace_s=1.0)
    loop = AttemptLoop(run, config)
    assert (loop.first_number, loop.restarts) == (4, AttemptBudget(2, 1))
    assert loop.restarts.allows_restart(loop.restarts.failures(3))
    assert not loop.restarts.allows_restart(loop.restarts.failures(4))
    _attempt(run, 4)
    _attempt(run, 5)  # one more than the budget: the job's own file, never read
    spec = {"max_restarts": 2, "nproc_per_node": 1}
    assert [a["number"] for a in job_attempts(run, spec, pauses=1)] == [1, 2, 3, 4]
    assert [a["number"] for a in job_attempts(run, spec, pauses=0)] == [1, 2, 3]
