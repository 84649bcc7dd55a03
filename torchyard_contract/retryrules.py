"""Retries decided by the cause: the spec's ``on_failure`` rules, the defaults, and the decision.

Part of the contract (``torchyard_contract``): the API validates a spec's rules with
:class:`FailureRule`; the job's attempt loop (``service.run.retrydecision``) calls :func:`decide`
after a failed attempt with what it saw — each failing rank's exit code and last lines of output.

Rules are tried in order, the spec's own first, then :data:`DEFAULT_RULES`; the first rule that
matches decides. A rule matches when every matcher it sets matches one failing rank (a rule with
no matcher matches any failure):

* ``exit_codes`` — the rank exited with one of these codes;
* ``signal`` — the rank was killed by this signal (``SIGKILL`` or ``KILL`` or ``"9"``);
* ``log_pattern`` — a regular expression found in one of the rank's last ``TAIL_LINES`` lines of
  output (each line cut to ``LOG_LINE_MAX_CHARS``).

Patterns run on RE2 (``google-re2``): its time is linear in the line's length, so no pattern
can stall the job's attempt loop the way a backtracking one can (``(a+)+$`` against a long line
ran for hours on Python's ``re``). A pattern RE2 cannot run (a backreference, a lookaround, an
atomic group or a possessive quantifier, a repetition over 1000) is refused when the spec is
validated, naming why. RE2 is imported on first use, not with this module: the ranks and most
attempt loops never match a pattern. :func:`decide` also takes a time budget, checked between patterns.

Actions: ``retry`` and ``retry_elsewhere`` (Slurm: the next attempt runs in a new allocation
that excludes the node the failing rank ran on, ``service.run.elsewhere``; locally the same as
``retry``) start another attempt while ``max_restarts`` allows; ``fail`` ends the job at once. No rule matched: retried while ``max_restarts`` allows (how every
failure was treated before rules existed).
"""

import functools
import signal as signals
import time
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from torchyard_contract.bounds import bounded_line
from torchyard_contract.spec_types import LabelValue, refuse_coercion

RULES_MAX = 32
PATTERN_MAX_CHARS = 256
EXIT_CODES_MAX = 64
TAIL_LINES = 50  # last lines of each failing rank's output a pattern is matched against
BACKOFF_MAX_S = 3600.0
PATTERN_MEM_BYTES = 8 << 20  # RE2's memory for one compiled pattern (its default)

Action = Literal["retry", "fail", "retry_elsewhere"]
RETRYING = ("retry", "retry_elsewhere")


# Every spelling ``signal`` accepts, stated as the schema's enum: the name (``SIGKILL``), the
# name without SIG (``KILL``) and the number (``"9"``). Aliases (SIGIOT, SIGCLD...) included.
SIGNAL_SPELLINGS: dict[str, int] = {
    spelling: int(number)
    for name, number in signals.Signals.__members__.items()
    for spelling in (name, name.removeprefix("SIG"), str(int(number)))
}


def _signal_number(value: str) -> int:
    """``SIGKILL``, ``KILL`` or ``9`` → 9; ValueError naming the allowed forms."""
    if value in SIGNAL_SPELLINGS:
        return SIGNAL_SPELLINGS[value]
    raise ValueError(
        f"unknown signal {value[:40]!r}; a name like 'SIGKILL', 'KILL' or 'SIGTERM', or its number"
    )


class RulesOutOfTime(Exception):
    """:func:`decide` ran past its budget before a rule decided."""


@functools.lru_cache(maxsize=4 * RULES_MAX)
def compile_pattern(pattern: str) -> Any:
    """``pattern`` compiled by RE2 (matching in time linear in the text); ValueError naming why
    RE2 cannot run it. RE2 is imported here, on first use (a few ms)."""
    import re2  # google-re2

    options = re2.Options()
    options.log_errors = False  # the refusal is the ValueError, not a line on stderr
    options.max_mem = PATTERN_MEM_BYTES
    try:
        return re2.compile(pattern, options)
    except re2.error as exc:
        why = exc.args[0] if exc.args else exc
        why = why.decode("utf-8", "replace") if isinstance(why, bytes) else str(why)
        raise ValueError(
            f"not a regular expression RE2 can run ({why}): patterns are matched in linear "
            "time, without backreferences, lookarounds, atomic groups or possessive "
            "quantifiers, with repetitions up to {1000}"
        ) from None


def _signal_enum(schema: dict) -> None:
    schema["enum"] = sorted(SIGNAL_SPELLINGS)


class FailureRule(BaseModel):
    """One ``on_failure`` rule: what a failure looks like and what to do about it."""

    # Not strict: 3.0 is the integer 3, as JSON Schema counts it; "3" and true are refused below.
    model_config = ConfigDict(extra="forbid")

    exit_codes: list[Annotated[int, Field(ge=1, le=255)]] | None = Field(
        default=None, min_length=1, max_length=EXIT_CODES_MAX,
        description="matches a failing rank that exited with one of these codes (1–255)",
    )
    signal: Annotated[str, Field(json_schema_extra=_signal_enum)] | None = Field(
        default=None,
        description="matches a failing rank killed by this signal: 'SIGKILL', 'KILL' or '9' "
        "(upper case; the enum lists every spelling)",
    )
    log_pattern: str | None = Field(
        default=None, min_length=1, max_length=PATTERN_MAX_CHARS,
        description=f"a regular expression (RE2 syntax: Python's without backreferences, "
        f"lookarounds or atomic groups) searched in a failing rank's last {TAIL_LINES} lines of "
        "output",
    )
    action: Action = Field(description="retry, fail, or retry_elsewhere (Slurm: another node)")
    description: LabelValue | None = Field(
        default=None,
        description="what the failure is, for the reason ('ran out of CUDA memory'); default: "
        "what matched",
    )

    @model_validator(mode="before")
    @classmethod
    def _numbers_are_numbers(cls, data: object) -> object:
        refuse_coercion(data, frozenset({"exit_codes"}))
        return data

    @field_validator("signal")
    @classmethod
    def _signal(cls, value: str | None) -> str | None:
        if value is None:
            return None
        return signals.Signals(_signal_number(value)).name

    @field_validator("log_pattern")
    @classmethod
    def _pattern(cls, value: str | None) -> str | None:
        if value is not None:
            compile_pattern(value)  # ValueError saying why RE2 cannot run it
        return value

    def what(self) -> str:
        """What a failure this rule matches looks like, for a reason."""
        if self.description:
            return self.description
        parts = []
        if self.exit_codes is not None:
            codes = ", ".join(str(c) for c in self.exit_codes)
            parts.append(f"exited with code {codes}" if len(self.exit_codes) == 1
                         else f"exited with one of {codes}")
        if self.signal is not None:
            parts.append(f"was killed by {self.signal}")
        if self.log_pattern is not None:
            parts.append(f"printed /{self.log_pattern}/")
        return " and ".join(parts) or "failed"


# The defaults, tried after a spec's own rules (docs/lifecycle.md, "Retry rules"). Built without
# validation, so importing this module (the built-in trainer does, through the spec) does not
# import RE2; tests/lifecycle/test_retry_rules.py validates them.
_default = FailureRule.model_construct
DEFAULT_RULES: tuple[tuple[str, FailureRule], ...] = (
    ("cuda-oom", _default(
        log_pattern=r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory",
        action="fail", description="ran out of CUDA memory",
    )),
    ("killed", _default(
        signal="SIGKILL", action="retry",
        description="was killed by SIGKILL (the OOM killer, a lost node)",
    )),
    ("collective-timeout", _default(
        log_pattern=r"DistBackendError|NCCL.{0,80}[Tt]imeout|[Tt]imed? ?out.{0,80}(NCCL|c10d|"
        r"collective)|Watchdog caught collective operation timeout|c10d.{0,80}[Tt]imeout",
        action="retry", description="hit an NCCL / c10d timeout",
    )),
)


@dataclass(frozen=True)
class RankFailure:
    """What the attempt loop saw of one failing rank."""

    rank: int
    exit_code: int  # negative: killed by that signal
    tail: str  # the rank's last lines of output


@dataclass(frozen=True)
class Decision:
    action: Action | None  # None: no rule matched (retry while max_restarts allows)
    rule: str | None  # "1" (the spec's first rule), "default:cuda-oom", None
    rank: int | None  # the failing rank the rule matched
    why: str  # "rank 1 ran out of CUDA memory"

    @property
    def retries(self) -> bool:
        return self.action != "fail"

    def label(self) -> str:
        """``rule 1`` / ``default rule cuda-oom`` / ``no rule``."""
        if self.rule is None:
            return "no rule"
        if self.rule.startswith("default:"):
            return f"default rule {self.rule.removeprefix('default:')}"
        return f"rule {self.rule}"


def _lines(tail: str) -> list[str]:
    return [bounded_line(line) for line in tail.splitlines()[-TAIL_LINES:]]


def _matches(rule: FailureRule, failure: RankFailure, lines: list[str], until: float) -> bool:
    if rule.exit_codes is not None and failure.exit_code not in rule.exit_codes:
        return False
    if rule.signal is not None and failure.exit_code != -_signal_number(rule.signal):
        return False
    if rule.log_pattern is not None:
        pattern = compile_pattern(rule.log_pattern)
        for line in lines:
            if time.monotonic() > until:
                raise RulesOutOfTime("the retry rules did not decide in time")
            if pattern.search(line):
                return True
        return False
    return True


def decide(
    rules: list[FailureRule], failures: list[RankFailure], *, ranks_known: bool = True,
    budget_s: float | None = None,
) -> Decision:
    """The first rule (the spec's, then the defaults) matching a failing rank decides.

    ``failures``: the ranks that failed, in the order to blame them (the first failing rank
    first); empty when no rank's exit is known (the whole group was killed).
    ``ranks_known=False``: torchrun named no failed rank (it died before its failure summary),
    so ``failures`` holds every rank with the group's exit code: a rule may still match one's
    output, but without a match the cause is the group's, not the first rank's.
    ``budget_s``: raise :class:`RulesOutOfTime` once matching has taken longer (each line's
    search is linear in its ≤ ``LOG_LINE_MAX_CHARS``, so this is checked often enough)."""
    until = time.monotonic() + budget_s if budget_s is not None else float("inf")
    ordered = [(str(i), r) for i, r in enumerate(rules, 1)]
    ordered += [(f"default:{name}", r) for name, r in DEFAULT_RULES]
    lines = {f.rank: _lines(f.tail) for f in failures}
    for label, rule in ordered:
        for failure in failures:
            if _matches(rule, failure, lines[failure.rank], until):
                return Decision(rule.action, label, failure.rank,
                                f"rank {failure.rank} {rule.what()}")
    first = failures[0] if failures and ranks_known else None
    why = f"rank {first.rank} failed" if first else "the group failed"
    return Decision(None, None, first.rank if first else None, why)
