"""Retries decided by the cause (issue 25, item 3): the spec's ``on_failure`` rules and the
defaults, on real 2-rank torchrun script jobs; the decision is in the attempt record and a job
that is not restarted says which rule stopped it (docs/lifecycle.md, "Retry rules")."""

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT, LiveServer, add_script
from tests.slurmcluster import SlurmCluster
from torchyard_contract.retryrules import DEFAULT_RULES, FailureRule, RankFailure, decide
from torchyard_contract.spec import JobSpec

API_TOKEN = "retry-rules-api-token-0123456789abcdef"

# Rank 1 fails in its first attempt the way argv[1] says; every later attempt succeeds.
FAILING = '''
import os, signal, sys, time
import worker
worker.ready()
rank, attempt = int(os.environ["RANK"]), int(os.environ["TORCHYARD_ATTEMPT"])
if rank == 1 and attempt == 1:
    # Only once rank 0 is ready too: a failure before every rank is would be a start-up
    # failure (never retried, no decision), which a loaded host makes likely.
    ready0 = os.path.join(os.environ["TORCHYARD_RUN_DIR"], "attempts", "1", "ready-rank-0")
    while not os.path.exists(ready0):
        time.sleep(0.02)
    mode = sys.argv[1]
    if mode == "code3":
        sys.exit(3)
    if mode == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "oom":
        print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", file=sys.stderr)
        sys.exit(1)
    if mode == "nccl":
        print("torch.distributed.DistBackendError: [Rank 1] Watchdog caught collective "
              "operation timeout: WorkNCCL(SeqNum=7, OpType=ALLREDUCE) ran for 600000 ms",
              file=sys.stderr)
        sys.exit(1)
    if mode == "corrupt":
        print("FATAL: shard 17 of the dataset is corrupt", flush=True)
        sys.exit(1)
    if mode == "catastrophic":  # what (a+)+$ backtracks on for ever in Python's re
        print("a" * 5000 + "!", file=sys.stderr, flush=True)
        sys.exit(1)
    sys.exit(1)  # plain
print(f"rank {rank} attempt {attempt} done", flush=True)
'''


@pytest.fixture
def server(shared_script_server: LiveServer) -> LiveServer:
    add_script(shared_script_server, "retry_failing.py", FAILING)
    return shared_script_server


def _run(server: LiveServer, mode: str, **spec: object) -> dict:
    body = {"entrypoint": "retry_failing.py", "args": [mode], "nproc_per_node": 2,
            "heartbeat_timeout_s": None}
    body.update(spec)
    with server.client() as c:
        r = c.post("/jobs", json=body)
        assert r.status_code == 201, r.text
        job_id = r.json()["id"]
    return server.wait_for(job_id, {"succeeded", "failed"}, timeout_s=120)


def test_exit_code_rule_fails_without_restart(server: LiveServer) -> None:
    job = _run(server, "code3", max_restarts=2,
               on_failure=[{"exit_codes": [3], "action": "fail"}])
    assert job["state"] == "failed", job
    assert job["reason"].startswith("not restarted: rank 1 exited with code 3 (rule 1)"), job
    [attempt] = job["attempts"]
    assert attempt["decision"]["action"] == "fail"
    assert attempt["decision"]["rule"] == "1" and attempt["decision"]["rank"] == 1


def test_sigkilled_rank_is_retried_by_default(server: LiveServer) -> None:
    job = _run(server, "sigkill", max_restarts=1)
    assert job["state"] == "succeeded", job
    first, second = job["attempts"]
    assert first["rank_exit_codes"]["1"] == -9
    assert first["decision"]["action"] == "retry"
    assert first["decision"]["rule"] == "default:killed"
    assert "rank 1 was killed by SIGKILL" in first["decision"]["summary"]
    assert second["decision"] is None


def test_cuda_oom_fails_by_default(server: LiveServer) -> None:
    job = _run(server, "oom", max_restarts=3)
    assert job["state"] == "failed", job
    assert job["reason"].startswith(
        "not restarted: rank 1 ran out of CUDA memory (default rule cuda-oom)"), job
    assert len(job["attempts"]) == 1
    assert job["attempts"][0]["decision"]["rule"] == "default:cuda-oom"


def test_spec_rule_overrides_a_default(server: LiveServer) -> None:
    job = _run(server, "oom", max_restarts=1,
               on_failure=[{"log_pattern": "CUDA out of memory", "action": "retry",
                            "description": "ran out of memory (fragmentation, retry)"}])
    assert job["state"] == "succeeded", job
    decision = job["attempts"][0]["decision"]
    assert decision["rule"] == "1" and decision["action"] == "retry"
    assert decision["cause"] == "rank 1 ran out of memory (fragmentation, retry)"


def test_collective_timeout_is_retried_by_default(server: LiveServer) -> None:
    job = _run(server, "nccl", max_restarts=1)
    assert job["state"] == "succeeded", job
    assert job["attempts"][0]["decision"]["rule"] == "default:collective-timeout"


def test_log_pattern_rule_fails(server: LiveServer) -> None:
    job = _run(server, "corrupt", max_restarts=2,
               on_failure=[{"log_pattern": r"shard \d+ of the dataset is corrupt",
                            "action": "fail", "description": "found a corrupt shard"}])
    assert job["state"] == "failed", job
    assert job["reason"].startswith(
        "not restarted: rank 1 found a corrupt shard (rule 1)"), job
    assert len(job["attempts"]) == 1


def test_no_rule_retries_while_max_restarts_allows(server: LiveServer) -> None:
    job = _run(server, "plain", max_restarts=0)
    assert job["state"] == "failed", job
    decision = job["attempts"][0]["decision"]
    assert decision["rule"] is None and decision["action"] == "fail"
    assert decision["summary"].startswith(
        "not restarted: max_restarts (0) used up; rank 1 failed"), job["attempts"]
    # The reason stays the failing rank's own, as before rules existed.
    assert not job["reason"].startswith("not restarted"), job

    job = _run(server, "plain", max_restarts=1, restart_backoff_s=0.5)
    assert job["state"] == "succeeded", job
    first, second = job["attempts"]
    assert first["decision"]["action"] == "retry" and first["decision"]["backoff_s"] == 0.5
    assert second["started_at"] - first["ended_at"] >= 0.5


@pytest.mark.parametrize("rule, field", [
    ({"exit_codes": [3], "action": "maybe"}, "action"),
    ({"exit_codes": ["3"], "action": "fail"}, "exit_codes"),
    ({"exit_codes": [0], "action": "fail"}, "exit_codes"),
    ({"signal": "SIGNOPE", "action": "retry"}, "signal"),
    ({"log_pattern": "(unclosed", "action": "fail"}, "log_pattern"),
    ({"regex": "x", "action": "fail"}, "regex"),
])
def test_bad_rules_are_422_naming_the_field(server: LiveServer, rule: dict, field: str) -> None:
    with server.client() as c:
        r = c.post("/jobs", json={"on_failure": [rule]})
    assert r.status_code == 422, r.text
    assert f"on_failure.0.{field}" in r.text or field in r.text, r.text


@pytest.mark.parametrize("pattern", [
    r"(a)\1", r"(?P<x>a)(?P=x)", r"error(?= in rank)", r"(?<!no )error", r"(?>a+)b", r"a++",
])
def test_a_pattern_re2_cannot_run_is_422_naming_the_field(server: LiveServer, pattern: str) -> None:
    """Backreferences and lookarounds need backtracking: refused at submit (issue 44, item 8)."""
    with server.client() as c:
        r = c.post("/jobs", json={"entrypoint": "retry_failing.py", "on_failure": [
            {"exit_codes": [3], "action": "fail"}, {"log_pattern": pattern, "action": "fail"}]})
    assert r.status_code == 422, r.text
    [detail] = r.json()["details"]
    assert detail["field"] == "on_failure.1.log_pattern", detail
    assert "not a regular expression RE2 can run" in detail["message"], detail


def test_a_catastrophic_pattern_decides_at_once() -> None:
    """``(a+)+$`` against long lines: Python's re backtracks for ever (the decision never came,
    the job stayed running past its deadline); RE2 decides in linear time. In a process of its
    own, so a match that never ends fails this test instead of hanging the worker."""
    probe = (
        "from torchyard_contract.retryrules import FailureRule, RankFailure, decide\n"
        "rules = [FailureRule(log_pattern='(a+)+$', action='fail')]\n"
        "ranks = [RankFailure(r, 1, ('a' * 5000 + '!\\n') * 60) for r in range(8)]\n"
        "print(decide(rules, ranks).rule)\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO_ROOT, capture_output=True,
                         text=True, timeout=60, check=True)
    assert out.stdout.split() == ["None"], out  # no rule matched: retried while allowed
    # A pattern that matches is found (lines are cut to 300 characters before matching).
    assert decide([FailureRule(log_pattern="(a+)+!$", action="fail")],
                  [RankFailure(0, 1, "a" * 250 + "!")]).rule == "1"


def test_matching_stops_at_its_budget() -> None:
    """However many ranks and lines, the patterns stop at ``budget_s``; rules without a pattern
    still decide."""
    from torchyard_contract.retryrules import RulesOutOfTime

    ranks = [RankFailure(r, 1, "x\n" * 50) for r in range(64)]
    with pytest.raises(RulesOutOfTime):
        decide([FailureRule(log_pattern="y", action="fail")], ranks, budget_s=0)
    assert decide([FailureRule(exit_codes=[1], action="fail")], ranks, budget_s=0).rule == "1"


def test_catastrophic_pattern_and_long_backoff_end_by_the_deadline(server: LiveServer) -> None:
    """A job whose rule is ``(a+)+$`` prints a long line and fails: the rules decide (retry),
    and the backoff (an hour) ends at ``max_runtime_s``: the job fails with 'deadline exceeded'
    rather than staying running (issue 44, item 8)."""
    job = _run(server, "catastrophic", max_restarts=1, restart_backoff_s=3600,
               max_runtime_s=20, on_failure=[{"log_pattern": "(a+)+$", "action": "retry"}])
    assert job["state"] == "failed", job
    assert job["reason"] == "deadline exceeded", job
    [attempt] = job["attempts"]  # no attempt started after the deadline
    assert attempt["rank_exit_codes"]["1"] == 1, attempt
    decision = attempt["decision"]
    assert decision["action"] == "retry" and decision["rule"] is None, decision
    assert decision["backoff_s"] == 3600, decision


def test_rules_are_ordered_and_first_match_wins() -> None:
    """The pure decision: the spec's rules before the defaults; the first failing rank first."""
    oom = RankFailure(1, 1, "x\ntorch.OutOfMemoryError: CUDA out of memory.\n")
    stopped = RankFailure(0, -15, "")
    assert decide([], [oom, stopped]).rule == "default:cuda-oom"
    rules = [FailureRule(signal="TERM", action="retry"), FailureRule(exit_codes=[1], action="fail")]
    assert decide(rules, [oom, stopped]).rule == "1"  # rule 1 matches rank 0's SIGTERM
    assert decide(rules[1:], [oom]).why == "rank 1 exited with code 1"
    assert decide([], [RankFailure(0, 2, "")]).rule is None
    # torchrun named no rank (no failure summary): every rank stands in, none is blamed...
    group = [RankFailure(0, 1, ""), RankFailure(1, 1, "shard 17 is corrupt")]
    unnamed = decide([], group, ranks_known=False)
    assert (unnamed.why, unnamed.rank, unnamed.rule) == ("the group failed", None, None)
    # ... but a rule matching one's output names that one.
    assert decide([FailureRule(log_pattern="corrupt", action="fail")], group,
                  ranks_known=False).rank == 1
    catch_all = [FailureRule(action="fail")]
    assert decide(catch_all, [oom]).action == "fail"
    assert {name for name, _ in DEFAULT_RULES} == {"cuda-oom", "killed", "collective-timeout"}
    for _, rule in DEFAULT_RULES:  # built unvalidated (no RE2 import with the module): valid
        FailureRule.model_validate(rule.model_dump(exclude_none=True))
    spec = JobSpec.model_validate({"on_failure": [{"signal": "9", "action": "retry"}]})
    assert spec.on_failure[0].signal == "SIGKILL"


def test_old_attempt_files_still_read(tmp_path: Path) -> None:
    from torchyard_contract.rundir import RunDir
    from torchyard_contract.runfiles import read_attempts

    run = RunDir(tmp_path)
    run.attempts_dir.mkdir()
    run.attempt_file(1).write_text(
        '{"number": 1, "started_at": 1.0, "ended_at": 2.0, "exit_code": 1, "reason": "x"}')
    [attempt] = read_attempts(run)
    assert attempt["decision"] is None


def test_rules_on_slurm(
    tmp_path: Path, slurm: SlurmCluster, slurm_server: Callable[..., LiveServer]
) -> None:
    """The same rules through the Slurm executor: 2 nodes × 1 rank, the attempt loop on the batch host
    reading rank 1's output from the other node's log on the shared run directory."""
    (tmp_path / "retry_failing.py").write_text(FAILING)
    server = slurm_server(TORCHYARD_SCRIPT_DIRS=str(tmp_path), TORCHYARD_API_TOKENS=API_TOKEN)
    common = {"nnodes": 2, "nproc_per_node": 1, "device": "cpu"}
    failed = _run(server, "code3", max_restarts=1,
                  on_failure=[{"exit_codes": [3], "action": "fail"}], **common)
    assert failed["state"] == "failed", failed
    assert failed["reason"].startswith("not restarted: rank 1 exited with code 3 (rule 1)"), failed
    assert [a["decision"]["rule"] for a in failed["attempts"]] == ["1"]
    oom = _run(server, "oom", max_restarts=1, **common)
    assert oom["state"] == "failed", oom
    assert oom["attempts"][0]["decision"]["rule"] == "default:cuda-oom", oom


def test_cli_attempts_table_shows_the_decision() -> None:
    from rich.console import Console

    from service.client.render import attempts_table

    console = Console(width=200, record=True)
    console.print(attempts_table([{
        "number": 1, "exit_code": 1, "rank_exit_codes": {"1": 3}, "reason": "rank 1 failed",
        "decision": {"summary": "not restarted: rank 1 exited with code 3 (rule 1)"},
    }]))
    assert "not restarted: rank 1 exited with code 3 (rule 1) — rank 1 failed" in console.export_text()
