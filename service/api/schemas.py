"""HTTP shapes (apart from the ORM tables). The job spec itself is ``torchyard_contract.spec.JobSpec``."""

from datetime import UTC, datetime
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    Field,
    TypeAdapter,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
    field_validator,
)

from service.domain.queue.scheduler import Waiting
from service.executor.reference import attempt_loop_pid
from service.store.tables import Job
from torchyard_contract.bounds import bounded_text
from torchyard_contract.spec import JobSpec
from torchyard_contract.state import JobState


def _as_stored(value: object, handler: ValidatorFunctionWrapHandler) -> JobSpec:
    """A stored spec reads as it was stored: one that a later, stricter rule refuses (it was
    accepted before the rule existed) must not make every read of its job a 500. The rules
    apply to what is submitted (``POST /jobs``), not to history: each field is then read by its
    type alone (bounds, patterns and cross-field rules unchecked), as stored."""
    try:
        return handler(value)
    except ValidationError:
        if not isinstance(value, dict):
            raise
    fields = {}
    for name, raw in value.items():
        info = JobSpec.model_fields.get(name)
        if info is None:
            continue  # a field since removed
        try:
            fields[name] = TypeAdapter(info.annotation).validate_python(raw)
        except ValidationError:
            fields[name] = raw
    return JobSpec.model_construct(**fields)


# The documented schema is JobSpec's; only reading a stored row is lenient.
StoredJobSpec = Annotated[JobSpec, WrapValidator(_as_stored)]

# The database keeps naive UTC; the wire says so (RFC 3339 needs an offset: "...Z").
UtcDatetime = Annotated[
    datetime, AfterValidator(lambda d: d if d.tzinfo else d.replace(tzinfo=UTC))
]


class AttemptDecisionRead(BaseModel):
    """Why a failed attempt was or was not retried."""

    action: Literal["retry", "fail", "retry_elsewhere"]
    rule: str | None = Field(
        description="the on_failure rule that decided: '1' = the spec's first, 'default:<name>' "
        "= a default rule, null = none matched (retried while max_restarts allows)"
    )
    rank: int | None = Field(description="the failing rank the rule matched")
    cause: str = Field(description="what failed: 'rank 1 ran out of CUDA memory'")
    summary: str = Field(description="the decision in words, with the rule")
    backoff_s: float = Field(description="seconds waited before the next attempt")
    excluded_node: str | None = Field(default=None, description="retry_elsewhere on Slurm: the "
                                      "node the next allocation leaves out; null = in place")


class RankWhereRead(BaseModel):
    """Where one rank was when the heartbeat timed out."""

    rank: int
    state: Literal["collective", "elsewhere", "unknown"]
    collective: str | None = Field(description="the collective it was waiting in")
    where: str | None = Field(description="its innermost frame of user code")


class HangStacksRead(BaseModel):
    """The stacks taken at a heartbeat timeout, per rank; the full stacks:
    ``GET /jobs/{id}/stacks?attempt=N``."""

    error: str | None = Field(description="why no stacks were taken; null when they were")
    ranks: list[RankWhereRead]


class AttemptRead(BaseModel):
    """One run of the job's ranks. ``startup_failure``: it failed before every rank was ready."""

    number: int
    started_at: float
    ended_at: float | None
    exit_code: int | None
    rank_exit_codes: dict[str, int] = Field(
        default_factory=dict,
        description="rank → exit code, as torchrun reported them (a rank it stopped: -15)",
    )
    reason: str | None = Field(
        description="at most 2000 characters; the full text is in the rank's log"
    )
    startup_failure: bool | None
    decision: AttemptDecisionRead | None = Field(
        default=None,
        description="a failed attempt: whether it was retried, by which on_failure rule and why "
        "(docs/lifecycle.md); null on success, for start-up failures, stops and older attempts",
    )
    stacks: HangStacksRead | None = Field(
        default=None,
        description="an attempt ended by a heartbeat timeout: where each rank was (collective "
        "or elsewhere, and its line of user code); null otherwise",
    )
    paused: bool = Field(
        default=False, description="it ended because the job was paused (no restart used)")

    @field_validator("reason")
    @classmethod
    def _bounded(cls, v: str | None) -> str | None:  # rows stored before reasons were bounded
        return bounded_text(v) if v is not None else None

    @field_validator("paused", mode="before")
    @classmethod
    def _not_paused(cls, v: object) -> object:  # the attempt loop writes null for an attempt not paused
        return False if v is None else v


class MlflowExportRead(BaseModel):
    """A job's MLflow export (docs/tracking.md)."""

    run_id: str | None = Field(description="the MLflow run; null until it is made")
    experiment: str | None = Field(description="the MLflow experiment of the run")
    state: str = Field(
        pattern=r"^(pending \d+|exported|error: .*)$",
        description="'pending N': N records not in MLflow yet ('pending 0': the run is still "
        "to be made or closed); 'exported': every record stored so far is in the run and its "
        "status follows the job's; 'error: …': the last try failed (it is retried)",
    )


class JobRead(BaseModel):
    """A job. Phase times (UTC): ``created_at`` queued, ``started_at`` launched (resources
    given, attempt loop started), ``running_at`` rendezvous done and rank 0 set up, ``first_metric_at``
    the earliest reported record, ``ended_at`` terminal."""

    id: int
    name: str
    state: JobState
    spec: StoredJobSpec
    created_at: UtcDatetime
    started_at: UtcDatetime | None
    running_at: UtcDatetime | None
    first_metric_at: UtcDatetime | None
    ended_at: UtcDatetime | None
    queue_position: int | None = Field(
        default=None, description="queued jobs: 1-based place in the queue order (priority, FIFO)"
    )
    waiting_reason: str | None = Field(
        default=None, description="queued jobs: why it has not started, e.g. 'needs 2 GPUs; 1 free'"
    )
    exit_code: int | None
    reason: str | None = Field(
        description="why it ended; at most 2000 characters, the full text is in the logs"
    )
    pid: int | None = Field(
        description="local executor: pid of the job's attempt loop (its process group); null otherwise"
    )
    devices: list[str]
    attempts: list[AttemptRead]
    sweep_id: int | None = Field(
        default=None, description="a sweep's trial: its sweep (GET /sweeps/{id}); else null")
    params: dict[str, bool | int | float | str] | None = Field(
        default=None, description="a sweep's trial: the parameters it was given; else null")
    pauses: int = Field(default=0, description="times the job was paused (by a user or a "
                        "preemption); each adds an attempt beyond max_restarts + 1")
    preemptions: int = Field(default=0, description="times the supervisor paused it to run a "
                             "job of higher priority")
    preempted_by: int | None = Field(
        default=None, description="paused by a preemption: the job it made room for; else null")
    exclude_nodes: list[str] = Field(default_factory=list, description="Slurm nodes its later "
                                     "allocations leave out: where a retry_elsewhere rule failed")
    owner: str | None = Field(default=None, description="who submitted it ('admin' for the "
                              "bootstrap tokens); null for jobs older than users and teams")
    team: str | None = Field(default=None, description="the team it belongs to (its members "
                             "control it, its viewers read it); null: admins only")
    mlflow: MlflowExportRead | None = Field(
        default=None, description="GET /jobs/{id} only: its MLflow run and the export's state; "
        "null when the job is not exported to MLflow (and in lists)")

    @classmethod
    def from_row(cls, job: Job, waiting: Waiting | None = None) -> "JobRead":
        """``waiting``: the scheduler's view of a queued job (ignored once it left the queue)."""
        queued = job.state == JobState.queued.value and waiting is not None
        return cls(
            id=job.id,
            name=job.name,
            state=JobState(job.state),
            spec=job.spec,  # type: ignore[arg-type]  # validated (leniently) by StoredJobSpec
            created_at=job.created_at,
            started_at=job.started_at,
            running_at=job.running_at,
            first_metric_at=job.first_metric_at,
            ended_at=job.ended_at,
            queue_position=waiting.position if queued and waiting else None,
            waiting_reason=_waiting_reason(job, waiting) if queued and waiting else None,
            exit_code=job.exit_code,
            reason=bounded_text(job.reason) if job.reason is not None else None,
            pid=attempt_loop_pid(job.executor, job.executor_ref),
            devices=job.devices.split(",") if job.devices else [],
            attempts=_attempts(job.attempts),
            sweep_id=job.sweep_id,
            params=job.params,
            pauses=job.pauses or 0,
            preemptions=job.preemptions or 0,
            preempted_by=job.preempted_by,
            exclude_nodes=[n for n in job.exclude_nodes or [] if isinstance(n, str)],
            owner=job.owner,
            team=job.team,
        )


def _waiting_reason(job: Job, waiting: Waiting) -> str:
    """The scheduler's reason; a preempted job says first why it was paused (``preempted by
    job 12``, ``paused to return 2 slots to team nlp``)."""
    if job.preempted_by is not None:
        return f"{job.reason or f'preempted by job {job.preempted_by}'}; {waiting.reason}"
    return waiting.reason


def _attempts(stored: list | None) -> list[AttemptRead]:
    """The stored attempt records that are valid; one stored before the attempt loop's files were read
    strictly may not be (it must not make every read of the job a 500)."""
    attempts = []
    for a in stored or []:
        try:
            attempts.append(AttemptRead.model_validate(a))
        except ValidationError:
            continue
    return attempts


class JobList(BaseModel):
    items: list[JobRead]
    next_before: int | None = Field(description="pass as ?before= for the next page; null at the end")


class ResourceRead(BaseModel):
    name: str = Field(description="'gpu:<index>' or 'cpu:<slot>'")
    kind: Literal["gpu", "cpu"]
    job_id: int | None = Field(description="the job holding it; null when free")
    job_name: str | None = Field(default=None, description="the holder's name (whatever its team: "
                                 "everyone sees who holds the box)")
    owner: str | None = Field(default=None, description="who submitted the holder")
    team: str | None = Field(default=None, description="the holder's team")


class ResourceTotals(BaseModel):
    total: int
    allocated: int
    free: int


class WarmRead(BaseModel):
    """The warm-rank pool of this host (docs/warm-ranks.md)."""

    state: Literal["starting", "ready", "broken"] = Field(
        description="starting: importing torch, or not answering its checks (jobs start cold; "
        "its running ranks go on); ready: serving warm ranks; "
        "broken: cannot serve, its socket's directory is not the service user's private one "
        "(jobs start cold, saying why; see the server's log)"
    )
    pool_size: int = Field(description="idle warm processes kept ready (TORCHYARD_WARM_POOL_SIZE)")
    idle: int = Field(description="idle warm processes now")
    active: int = Field(description="warm processes running a job's rank or torchrun agent now")
    served: int = Field(description="hand-offs by the current warm server")
    refused: int = Field(description="hand-offs it refused (those processes started cold)")
    memory_bytes: int = Field(
        description="RSS of the warm server plus the pages its idle processes do not share"
    )
    memory_limit_bytes: int = Field(description="TORCHYARD_WARM_MAX_MEMORY_MIB; 0 = none")
    cuda_initialized: bool = Field(description="always false: the pool never touches CUDA")
    restarts: int = Field(description="times the warm server was replaced")


class NodeRead(BaseModel):
    name: str
    state: str = Field(description="Slurm's node state: idle, mixed, allocated, down, drained, …")
    partition: str
    cpus: int
    cpus_allocated: int
    gpus: int = Field(description="GPUs in the node's GRES")


class ResourcesRead(BaseModel):
    executor: str = Field(
        default="local",
        description="'local': this host's GPUs and CPU slots, booked by torchyard (items); "
        "'slurm': Slurm allocates, nodes lists the partition's nodes (from sinfo) and items "
        "is empty",
    )
    gpu: ResourceTotals
    cpu: ResourceTotals
    items: list[ResourceRead]
    warm: WarmRead | None = Field(
        default=None, description="the warm-rank pool; null when warm ranks are off"
    )
    nodes: list[NodeRead] = Field(default_factory=list, description="slurm executor: the nodes")


class ErrorDetail(BaseModel):
    field: str | None
    message: str


class ErrorBody(BaseModel):
    error: str
    message: str
    details: list[ErrorDetail] = []


class PackageRead(BaseModel):
    """An uploaded package (``POST /packages``); a job names it by ``digest``."""

    digest: str = Field(description="'sha256:' and the hex SHA-256 of the uploaded bytes")
    size: int = Field(description="bytes uploaded (the archive)")
    files: int = Field(description="members unpacked (files and directories)")


class ArtifactRead(BaseModel):
    path: str = Field(description="relative to the job's output directory; checkpoints under "
                      "'checkpoints/'. Bytes of a name that are not UTF-8 are written %XX, and "
                      "'%' as %25 (docs/packages.md); download by this path, URL-quoted")
    size: int = Field(description="bytes")
    modified: float = Field(description="last modification, Unix seconds")


class ArtifactList(BaseModel):
    job_id: int
    items: list[ArtifactRead]
    next_after: str | None = Field(description="pass as ?after= for the next page; null = last. "
                                   "Set with fewer than `limit` items where the page stopped at "
                                   "its bound on entries examined")
    skipped: int = Field(description="entries this page passed over that are not served "
                         "(symlinks, FIFOs, hard links, files of another user, paths over 4096 "
                         "characters, directories over 1,000,000 entries)")
    examined: int = Field(description="directory entries this page read (the page's cost; "
                          "bounded, docs/security.md)")
