"""``GET /jobs/{id}/stacks``: where every rank of a job is — its Python stacks, all threads.

Without ``attempt``: taken now from a running job (its attempt loop runs the sampler, see
``service.run.stackdump``); with ``attempt``: the ones kept when that attempt's heartbeat timed out.
Each rank is classified: inside a collective (``torch.distributed``, DDP) or elsewhere, with its
innermost frame of user code (docs/lifecycle.md, "Hang diagnosis").

Async: a call that takes stacks now awaits the attempt loop's answer (a process the job controls, which
it may have stopped) on the event loop until a deadline, holding no thread; how many may wait at
once is bounded per job and in all (``service.api.stacksgate``: 429 with ``Retry-After``).
What is read (a file of up to 8 MiB) is parsed and validated on the thread pool.
"""

from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, Field, ValidationError
from starlette.concurrency import run_in_threadpool

from service.api.deps import JobDep, SettingsDep
from service.api.drain import draining
from service.api.errors import _ERROR, ERROR_RESPONSES, ApiError
from service.api.stacksgate import StacksBusy, StacksGate
from service.domain.files import stackrequest as stacks
from torchyard_contract.rundir import RunDir
from torchyard_contract.state import JobState

router = APIRouter(prefix="/jobs", tags=["jobs"])


class Frame(BaseModel):
    name: str = Field(description="the function")
    file: str
    line: int | None


class ThreadStack(BaseModel):
    name: str = Field(description="the thread's name (MainThread, …)")
    active: bool = Field(description="running (on a CPU) when sampled, rather than waiting")
    frames: list[Frame] = Field(description="innermost first")


class RankStacks(BaseModel):
    rank: int
    pid: int | None = None
    state: Literal["collective", "elsewhere", "unknown"] = Field(
        description="collective: waiting inside torch.distributed or DDP (or in backward, where "
        "DDP's reducer all-reduces); elsewhere: anywhere else; unknown: its stacks were not taken"
    )
    collective: str | None = Field(default=None, description="the collective it waits in")
    where: str | None = Field(
        default=None, description="its innermost frame of user code: 'train.py:42 in load_batch'"
    )
    error: str | None = Field(default=None, description="why this rank's stacks were not taken")
    threads: list[ThreadStack] = Field(default_factory=list)


class StacksRead(BaseModel):
    attempt: int
    trigger: Literal["request", "heartbeat timeout"]
    taken_at: float = Field(description="Unix seconds")
    took_s: float | None = Field(default=None, description="how long taking them took")
    host: str | None = None
    error: str | None = Field(
        description="why no stacks were taken (no sampler, no ptrace rights, no rank process); "
        "null when they were"
    )
    ranks: list[RankStacks]


UNAVAILABLE = {503: {**_ERROR, "description": "the stacks could not be taken: the reason says "
                     "why (no sampler, no ptrace rights, the attempt loop did not answer within 15 s)"}}
BUSY = {429: {**_ERROR, "description": "too many stacks calls are waiting already, for this job "
              "(TORCHYARD_STACKS_PER_JOB, default 2) or in all (TORCHYARD_STACKS_IN_FLIGHT, "
              "default 4); retry after Retry-After seconds",
              "headers": {"Retry-After": {"description": "seconds until a call in the way has "
                                          "ended", "schema": {"type": "integer"}}}}}


@router.get(
    "/{job_id}/stacks", response_model=StacksRead,
    responses={**{k: ERROR_RESPONSES[k] for k in (404, 409)}, **BUSY, **UNAVAILABLE},
)
async def read_stacks(
    job: JobDep, settings: SettingsDep, request: Request,
    attempt: Annotated[int | None, Query(
        ge=1, le=10_001, description="the stacks kept at this attempt's heartbeat timeout; "
        "unset = take them now (a running job)")] = None,
) -> StacksRead:
    """Every rank's Python stacks (all threads), classified; see docs/lifecycle.md."""
    run = RunDir.for_job(settings.runs_dir, job.id)
    if attempt is not None:
        data = await run_in_threadpool(stacks.at_hang, run, attempt)
        if data is None:
            raise ApiError(404, "not_found",
                           f"job {job.id} attempt {attempt} has no stacks (no heartbeat timeout)")
        return await run_in_threadpool(_validated, data, False)
    if job.state != JobState.running.value:
        raise ApiError(409, "conflict", f"job {job.id} is {job.state}; stacks are taken of a "
                       "running job (the stacks of a hang: ?attempt=N)")
    gate: StacksGate = request.app.state.stacks_gate
    try:
        with gate.slot(job.id, stacks.STACKS_WAIT_S):
            data = await stacks.take_now(run, stop=draining(request).is_set)
    except StacksBusy as exc:
        raise ApiError(429, "too_many_requests", f"{exc}; retry after {exc.retry_after_s} s",
                       {"Retry-After": str(exc.retry_after_s)}) from None
    except (stacks.StacksTimeout, OSError) as exc:
        raise ApiError(503, "unavailable", f"stacks could not be taken: {exc}") from exc
    return await run_in_threadpool(_validated, data, True)


def _validated(data: dict, taken_now: bool) -> StacksRead:
    """The answer as the response model (503 when it is not one, or says why none were taken)."""
    try:
        answer = StacksRead.model_validate(data)
    except ValidationError as exc:
        raise ApiError(503, "unavailable",
                       f"stacks could not be read ({exc.error_count()} invalid fields)") from exc
    if taken_now and answer.error:
        raise ApiError(503, "unavailable", f"stacks could not be taken: {answer.error}")
    return answer
