"""The attempt loop's files (``torchyard_contract.runfiles``): one model per file, written by the
run side and read by the server through it, atomically, without building a schema on the
attempt loop's start path."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from torchyard_contract.rundir import RunDir
from torchyard_contract.runfiles import (
    AttemptDecision,
    AttemptFile,
    HangStacks,
    Outcome,
    OutcomeState,
    RankWhere,
    made,
    read_attempt,
    read_attempts,
    read_outcome,
    write_run_file,
)


def test_an_attempt_written_through_its_model_is_read_back_whole(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    record = made(AttemptFile, number=1, started_at=1_800_000_000.0)
    write_run_file(run.attempt_file(1), record)
    assert [a["ended_at"] for a in read_attempts(run)] == [None]
    decision = made(AttemptDecision, action="retry_elsewhere", rule="1", rank=2,
                    cause="rank 2 exited with code 3", summary="restarted elsewhere",
                    backoff_s=1.5, excluded_node="n2")
    stacks = made(HangStacks, error=None, ranks=[
        made(RankWhere, rank=0, state="collective", collective="allreduce", where=None)])
    ended = record.model_copy(update={
        "ended_at": 1_800_000_010.0, "exit_code": 1, "reason": "rank 2 failed",
        "rank_exit_codes": {"2": 3}, "startup_failure": False, "decision": decision,
        "stacks": stacks,
    })
    write_run_file(run.attempt_file(1), ended)
    # Exactly the model's fields, nothing else (no dict literal of its own).
    assert list(json.loads(run.attempt_file(1).read_text())) == list(AttemptFile.model_fields)
    assert read_attempt(run, 1) == AttemptFile.model_validate(
        json.loads(run.attempt_file(1).read_text()))
    [attempt] = read_attempts(run)
    assert attempt["decision"]["excluded_node"] == "n2" and attempt["decision"]["backoff_s"] == 1.5
    assert attempt["stacks"]["ranks"][0]["collective"] == "allreduce"
    assert attempt["paused"] is None and attempt["rank_exit_codes"] == {"2": 3}
    assert not list(run.attempts_dir.glob(".*"))  # no temporary file left behind


@pytest.mark.parametrize("state", list(OutcomeState))
def test_every_outcome_state_is_written_and_read_through_the_model(
    tmp_path: Path, state: OutcomeState,
) -> None:
    run = RunDir(tmp_path)
    nodes = ["n1"] if state is OutcomeState.requeue else []
    outcome = made(Outcome, state=state, exit_code=3, reason="why", exclude_nodes=nodes,
                   attempts=2, ended_at=1_800_000_000.0)
    write_run_file(run.exit_file, outcome)
    read = read_outcome(run)
    assert read is not None and read.state == state.value
    assert (read.exit_code, read.exclude_nodes, read.attempts) == (3, nodes, 2)


def test_a_writer_cannot_lose_a_field_to_a_typo() -> None:
    with pytest.raises(TypeError, match="exitcode"):
        made(Outcome, state=OutcomeState.failed, exitcode=1)


def test_writing_builds_no_schema() -> None:
    """A first attempt's files cost the attempt loop no schema build (~30 ms of CPU a job)."""
    probe = (
        "import json, sys, tempfile, time\n"
        "from pathlib import Path\n"
        "from torchyard_contract import runfiles as r\n"
        "from torchyard_contract.rundir import RunDir\n"
        "run = RunDir(Path(tempfile.mkdtemp()))\n"
        "a = r.made(r.AttemptFile, number=1, started_at=time.time())\n"
        "r.write_run_file(run.attempt_file(1), a)\n"
        "r.write_run_file(run.attempt_file(1), a.model_copy(update={'exit_code': 0}))\n"
        "r.write_run_file(run.exit_file, r.made(r.Outcome, state=r.OutcomeState.succeeded))\n"
        "print(json.dumps([m.__pydantic_complete__ for m in (r.AttemptFile, r.Outcome)]))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    assert json.loads(out) == [False, False]
