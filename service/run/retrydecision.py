"""After a failed attempt: retry or not, decided by the cause (``torchyard_contract.retryrules``).

The attempt loop (``service.run.attemptloop``) calls :func:`decide_attempt` once an attempt
failed on its own (not a start-up failure, not the deadline, not a stop the attempt loop made): it gathers
each failing rank's exit code (torchrun's failure summary, in the attempt record) and last lines
of output (``RunDir.rank_output``), lets the job's ``on_failure`` rules and the defaults decide,
and writes the decision into the attempt record (``AttemptFile.decision``, the contract's
``AttemptDecision``: ``torchyard_contract.runfiles``).
The patterns run here, in the job's own attempt loop, on RE2 (linear time, see
``torchyard_contract.retryrules``) and within a time budget (``RULES_BUDGET_S``, or what is left
of the job's ``max_runtime_s`` if less): rules that have not decided by then are not applied
(the attempt is retried while ``max_restarts`` allows), so no output a job prints can hold its
attempt loop past its deadline.

``retry_elsewhere`` where the launcher can leave a node out (``elsewhere``: Slurm) names the
failing rank's node (``service.run.elsewhere``) in the decision (``excluded_node``); the attempt
loop then ends the allocation so that the next one excludes it. When the node is not found, or
elsewhere (the local launcher), the attempt is retried in place like ``retry``.
"""

import signal
import time
from collections.abc import Callable
from dataclasses import dataclass

from service.run.elsewhere import failing_node
from torchyard_contract.attempts import AttemptBudget
from torchyard_contract.bounds import bounded_text
from torchyard_contract.launch import LaunchConfig
from torchyard_contract.retryrules import FailureRule, RankFailure, RulesOutOfTime, decide
from torchyard_contract.rundir import RunDir
from torchyard_contract.runfiles import (
    AttemptDecision,
    AttemptFile,
    made,
    read_attempt,
    write_run_file,
)
from torchyard_contract.safefile import read_tail

TAIL_BYTES = 64 * 1024  # of each failing rank's output, for the rules' patterns
BACKOFF_GROWTH_MAX = 10.0  # the pause before a restart doubles up to this many times the first
BACKOFF_POLL_S = 0.2
RULES_BUDGET_S = 5.0  # matching every rule against every failing rank's last lines, at most


@dataclass(frozen=True)
class Verdict:
    """What follows a failed attempt: its decision, as its record keeps it (``excluded_node``:
    retry_elsewhere's node to restart without, Slurm; ``summary``: the decision in words), and
    the job's reason should the job end here."""

    decision: AttemptDecision
    reason: str

    @property
    def retry(self) -> bool:
        return self.decision.action != "fail"


def _failures(
    run: RunDir, number: int, record: AttemptFile, world_size: int
) -> tuple[list[RankFailure], bool]:
    """The failing ranks, first to blame first, and whether torchrun named them (False: no
    failure summary, e.g. its agent died with a warm server, so every rank stands in)."""
    codes = {
        int(r): c for r, c in record.rank_exit_codes.items()
        if r.isdigit() and int(r) < world_size and c != 0
    }
    named = bool(codes)
    if not codes and record.exit_code is not None:
        codes = dict.fromkeys(range(world_size), record.exit_code)  # no summary: every rank
    # The rank that failed first is not one torchrun stopped (-SIGTERM) because another failed.
    order = sorted(codes, key=lambda r: (codes[r] == -signal.SIGTERM, r))
    return [
        RankFailure(r, codes[r], read_tail(run.rank_output(number, r), TAIL_BYTES)) for r in order
    ], named


def decide_attempt(
    run: RunDir, config: LaunchConfig, number: int, reason: str | None,
    restarts: AttemptBudget | None = None, elsewhere: bool = False,
    budget_s: float = RULES_BUDGET_S,
) -> Verdict:
    """Decide after failed attempt ``number``; records the decision in ``attempts/<n>.json``.
    ``restarts``: the job's restart budget (``torchyard_contract.attempts``; default: no
    attempt a pause ended); ``elsewhere``: the launcher can restart the job without a node
    (Slurm), so ``retry_elsewhere`` names the failing rank's; ``budget_s``: the time the rules'
    patterns may take (past it they are not applied)."""
    restarts = restarts if restarts is not None else config.budget()
    try:
        return _decide(run, config, number, reason, restarts, elsewhere, budget_s)
    # Never worse than before rules existed: retried while max_restarts allows.
    except (OSError, ValueError, RulesOutOfTime) as exc:
        print(f"attempt {number}: retry rules not applied: {exc}", flush=True)
        retry = restarts.allows_restart(restarts.failures(number))
        return Verdict(made(AttemptDecision, action="retry" if retry else "fail",
                            summary=bounded_text(f"retry rules not applied: {exc}", 700)),
                       reason or "failed")


def _decide(
    run: RunDir, config: LaunchConfig, number: int, reason: str | None,
    restarts: AttemptBudget, elsewhere: bool, budget_s: float,
) -> Verdict:
    record = read_attempt(run, number)  # as this process wrote it, read as the server reads it
    if record is None:
        raise ValueError(f"attempt {number}'s record cannot be read back")
    rules = [FailureRule.model_validate(r) for r in config.on_failure or []]
    failed, named = _failures(run, number, record, config.world_size)
    decision = decide(rules, failed, ranks_known=named, budget_s=max(0.0, budget_s))
    label = decision.label()
    failures = restarts.failures(number)
    used_up = not restarts.allows_restart(failures)
    if decision.action == "fail":
        retry, summary = False, f"not restarted: {decision.why} ({label})"
    elif used_up:
        retry = False
        summary = f"not restarted: max_restarts ({config.max_restarts}) used up; {decision.why} ({label})"
    else:
        retry, summary = True, f"restarted: {decision.why} ({label})"
    excluded = None
    if retry and elsewhere and decision.action == "retry_elsewhere":
        node = failing_node(run, config, number, decision.rank)
        excluded = node.name
        if excluded is not None:
            summary = f"restarted elsewhere: {decision.why} ({label}); excluding node {excluded}"
        else:
            print(f"attempt {number}: retry_elsewhere: restarting in place, the failing rank's "
                  f"node is not known: {node.why}", flush=True)
            summary = f"restarted in place: {decision.why} ({label}); its node is not known"
    backoff = 0.0
    if retry and config.restart_backoff_s > 0:
        growth = min(2.0 ** (failures - 1), BACKOFF_GROWTH_MAX)
        backoff = config.restart_backoff_s * growth
    kept = made(
        AttemptDecision, action=(decision.action or "retry") if retry else "fail",
        rule=decision.rule, rank=decision.rank, cause=bounded_text(decision.why, 500),
        summary=bounded_text(summary, 700), backoff_s=backoff, excluded_node=excluded,
    )
    write_run_file(run.attempt_file(number), record.model_copy(update={"decision": kept}))
    if decision.action == "fail":
        job_reason = f"{summary}: {reason}" if reason else summary
    else:
        job_reason = reason or summary  # used up: the last attempt's reason, as always
    return Verdict(kept, bounded_text(job_reason))


def budget_s(started: float, max_runtime_s: float | None) -> float:
    """How long the rules may take: ``RULES_BUDGET_S``, or what is left of the job's
    ``max_runtime_s`` (``started``: when this launch began, Unix seconds) if less."""
    if max_runtime_s is None:
        return RULES_BUDGET_S
    return max(0.0, min(RULES_BUDGET_S, started + max_runtime_s - time.time()))


def wait_backoff(seconds: float, stop: Callable[[], bool]) -> None:
    """Sleep ``seconds`` before the next attempt, ending early when ``stop()`` (a cancel)."""
    end = time.monotonic() + seconds
    while not stop() and (left := end - time.monotonic()) > 0:
        time.sleep(min(left, BACKOFF_POLL_S))
