"""What a job's attempt loop writes for the server, attempt records and the outcome: one model
per file, written (:func:`write_run_file`) and read (:func:`read_attempts`, :func:`read_outcome`)
through it.

The attempt loop builds its files with :func:`made` (its own values, not validated: validating
would build the models' schemas, ~30 ms of CPU on every job's start path) and writes them
atomically and confined (``torchyard_contract.runwrite``). The server validates what it reads.

The job's processes can write in its run directory too (a script's relative paths land there),
so nothing is taken on trust (docs/security.md, "What a job can do"):

* only names torchyard makes are read: ``attempts/1.json``, ``attempts/2.json``, … in order, and
  ``exit.json``; any other file there (``attempts/results.json``) is never looked at;
* attempt ``n + 1`` exists only once attempt ``n`` has ended (the attempt loop's order), and never more
  than the job's restart budget allows (``AttemptBudget.attempts_max``,
  ``torchyard_contract.attempts``);
* regular files only (a FIFO would block the reader), at most ``RUN_FILE_MAX_BYTES`` each;
* every field is validated and bounded (``AttemptFile``, ``Outcome``).

A file that fails any of this is logged (once per version of the file) and treated as missing;
nothing here raises.
"""

import json
import logging
import math
from enum import Enum
from pathlib import Path
from typing import Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from torchyard_contract import runwrite
from torchyard_contract.bounds import bounded_text
from torchyard_contract.nodes import NodeName
from torchyard_contract.rundir import RunDir
from torchyard_contract.safefile import read_bytes

logger = logging.getLogger(__name__)

RUN_FILE_MAX_BYTES = 256 * 1024
ATTEMPTS_MAX = 10_001  # the spec's max_restarts is at most 10_000
EXIT_CODE_BOUND = 2**31
_warned: set[tuple[str, int, int]] = set()


# Every run-file model: unknown fields ignored, types strict, and the schema built at first use,
# not at import (the job's attempt loop imports this module and, for a first attempt, reads nothing).
_RUN_FILE_CONFIG = ConfigDict(extra="ignore", strict=True, defer_build=True)


def _time(v: float | None) -> float | None:
    if v is not None and not (math.isfinite(v) and 0 <= v <= 1e11):
        raise ValueError("not a Unix time")
    return v


class AttemptDecision(BaseModel):
    """Why a failed attempt was or was not retried (``service.run.retrydecision``)."""

    model_config = _RUN_FILE_CONFIG

    action: Literal["retry", "fail", "retry_elsewhere"]
    rule: str | None = Field(default=None, max_length=64)  # "1", "default:cuda-oom", None
    rank: int | None = Field(default=None, ge=0, le=2**31)
    cause: str = Field(default="", max_length=2000)
    summary: str = Field(default="", max_length=2000)
    backoff_s: float = Field(default=0.0, ge=0, le=1e6)
    # retry_elsewhere on Slurm: the node the job's next allocation leaves out; None = in place.
    excluded_node: NodeName | None = None


class RankWhere(BaseModel):
    """Where one rank was when the heartbeat timed out (``service.run.stackdump``)."""

    model_config = _RUN_FILE_CONFIG

    rank: int = Field(ge=0, le=2**31)
    state: Literal["collective", "elsewhere", "unknown"]
    collective: str | None = Field(default=None, max_length=200)
    where: str | None = Field(default=None, max_length=1000)


class HangStacks(BaseModel):
    """The stacks taken at a heartbeat timeout, per rank (the full dump: GET .../stacks)."""

    model_config = _RUN_FILE_CONFIG

    error: str | None = Field(default=None, max_length=2000)
    ranks: list[RankWhere] = Field(default_factory=list, max_length=65_536)


class AttemptFile(BaseModel):
    """``attempts/<n>.json`` as the attempt loop writes it (``service.run.attemptloop``)."""

    model_config = _RUN_FILE_CONFIG

    number: int = Field(ge=1, le=ATTEMPTS_MAX)
    started_at: float
    ended_at: float | None = None
    exit_code: int | None = Field(default=None, ge=-EXIT_CODE_BOUND, lt=EXIT_CODE_BOUND)
    rank_exit_codes: dict[str, int] = Field(default_factory=dict, max_length=65_536)
    reason: str | None = None
    startup_failure: bool | None = None
    decision: AttemptDecision | None = None  # failed attempts since retry rules; None before
    stacks: HangStacks | None = None  # a heartbeat timeout: where each rank was
    paused: bool | None = None  # it ended because the job was paused (not a failure)

    _times = field_validator("started_at", "ended_at", mode="before")(
        lambda v: _time(float(v)) if isinstance(v, int | float) and not isinstance(v, bool) else v
    )
    _reason = field_validator("reason")(lambda v: bounded_text(v) if v is not None else None)


class OutcomeState(str, Enum):
    """How a launch ended (``exit.json``'s ``state``). ``paused``: the job is to be resumed;
    ``requeue``: the attempt loop ended its Slurm allocation to restart the job in a new one that
    leaves out ``exclude_nodes`` (``retry_elsewhere``): not an end of the job, which is queued
    again."""

    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"
    paused = "paused"
    requeue = "requeue"


# ``Outcome.state`` as its strict model reads JSON (tests/project/test_vocabularies.py).
OutcomeStateName = Literal["succeeded", "failed", "cancelled", "paused", "requeue"]
REQUEUE = OutcomeState.requeue
OUTCOME_NODES_MAX = 16


class Outcome(BaseModel):
    """``exit.json``: how the launch ended, written once by the attempt loop."""

    model_config = _RUN_FILE_CONFIG

    state: OutcomeStateName
    exit_code: int | None = Field(default=None, ge=-EXIT_CODE_BOUND, lt=EXIT_CODE_BOUND)
    reason: str | None = None
    # ``requeue``: the nodes to leave out from now on (the failing rank's); [] otherwise.
    exclude_nodes: list[NodeName] = Field(default_factory=list, max_length=OUTCOME_NODES_MAX)
    attempts: int | None = Field(default=None, ge=0, le=2**31)  # the launch's last attempt
    ended_at: float | None = None  # when the attempt loop wrote it (Unix seconds)

    _reason = field_validator("reason")(lambda v: bounded_text(v) if v is not None else None)
    _ended = field_validator("ended_at", mode="before")(
        lambda v: _time(float(v)) if isinstance(v, int | float) and not isinstance(v, bool) else v
    )


def _load(path: Path) -> object | None:
    """The JSON in ``path`` (a regular file under the size bound), else None; warns once."""
    raw = read_bytes(path, RUN_FILE_MAX_BYTES)
    if raw is None:
        if path.exists() or path.is_symlink():
            _warn(path, f"not a regular file, or larger than {RUN_FILE_MAX_BYTES} bytes")
        return None
    try:
        return json.loads(raw)
    except ValueError:
        _warn(path, "not JSON")
        return None


def _warn(path: Path, why: str) -> None:
    try:
        st = path.lstat()
        key = (str(path), st.st_mtime_ns, st.st_size)
    except OSError:
        key = (str(path), 0, 0)
    if key in _warned:
        return
    if len(_warned) > 10_000:
        _warned.clear()
    _warned.add(key)
    logger.warning("run file %s ignored: %s", path, why[:300])


def read_outcome(run: RunDir) -> Outcome | None:
    """The job's outcome; None when ``exit.json`` is missing or not a valid outcome."""
    data = _load(run.exit_file)
    if data is None:
        return None
    try:
        return Outcome.model_validate(data)
    except ValidationError as exc:
        _warn(run.exit_file, f"invalid outcome: {exc.error_count()} errors")
        return None


def read_attempts(
    run: RunDir, max_attempts: int = ATTEMPTS_MAX, world_size: int | None = None
) -> list[dict]:
    """Attempt records ``1, 2, …`` as plain dicts, up to the first missing or invalid one.

    ``max_attempts``: ``AttemptBudget.attempts_max`` of the job; ``world_size``: its ranks (exit
    codes of other ranks are dropped)."""
    attempts: list[dict] = []
    for number in range(1, min(max_attempts, ATTEMPTS_MAX) + 1):
        record = read_attempt(run, number)
        if record is None:
            break
        codes = {
            rank: code for rank, code in record.rank_exit_codes.items()
            if rank.isdigit() and (world_size is None or int(rank) < world_size)
            and -EXIT_CODE_BOUND <= code < EXIT_CODE_BOUND
        }
        attempts.append(record.model_dump() | {"rank_exit_codes": codes})
        if record.ended_at is None:
            break  # the attempt loop starts attempt n + 1 only after n ended
    return attempts


M = TypeVar("M", bound=BaseModel)


def made(model: type[M], **values: object) -> M:
    """A run file's model from its writer's own values, not validated (see the module's
    docstring); a name the model does not have is a ``TypeError``, not a field quietly lost."""
    unknown = set(values) - set(model.model_fields)
    if unknown:
        raise TypeError(f"{model.__name__} has no field {', '.join(sorted(unknown))}")
    return model.model_construct(**values)


def _plain(value: object) -> object:
    """JSON's values of a model made with :func:`made` (its fields, in order)."""
    if isinstance(value, BaseModel):
        return {name: _plain(getattr(value, name)) for name in type(value).model_fields}
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def write_run_file(path: Path, model: BaseModel) -> None:
    """``model`` as ``path`` (an attempt record, the outcome), atomically: a reader never sees
    half a file, and nothing is written through a link the job planted (``runwrite``)."""
    runwrite.make_dir(path.parent)
    runwrite.write_file(path, json.dumps(_plain(model)).encode())


def read_attempt(run: RunDir, number: int) -> AttemptFile | None:
    """Attempt ``number``'s record, validated; None when missing or invalid (logged)."""
    path = run.attempt_file(number)
    data = _load(path)
    if data is None:
        return None
    try:
        record = AttemptFile.model_validate(data)
    except ValidationError as exc:
        _warn(path, f"invalid attempt record: {exc.error_count()} errors")
        return None
    if record.number != number:
        _warn(path, f"names attempt {record.number}")
        return None
    return record
