"""The job spec: one pydantic model validated by the API and again by each rank.

Part of the contract (``torchyard_contract``): shared by ``service`` and ``worker``, free of torch,
FastAPI and SQLAlchemy imports.
"""

import re

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

from torchyard_contract.retryrules import BACKOFF_MAX_S, RULES_MAX, FailureRule
from torchyard_contract.spec_types import (
    ARGS_MAX,
    BUILTIN_ONLY_FIELDS,
    ENTRYPOINT_MAX,
    ENTRYPOINT_PATTERN,
    ENV_MAX,
    LABELS_MAX,
    NNODES_MAX,
    NOTIFY_MAX,
    PACKAGE_PATTERN,
    PATIENCE_MAX,
    PRIORITY_MAX,
    PRIORITY_MIN,
    RESERVED_ENV_TEXT,
    SLURM_FIELDS,
    Backend,
    DatasetName,
    Device,
    EnvName,
    EnvValue,
    JobName,
    LabelKey,
    LabelValue,
    ModelName,
    NoNul,
    OptimizerName,
    SecretName,
    SlurmConstraint,
    SlurmName,
    WebhookName,
    env_name_reserved,
    keys_by_name_pattern,
    refuse_coercion,
)
from torchyard_contract.tracking import MlflowField


class JobSpec(BaseModel):
    """What a user asks for. Unknown fields are rejected; every number is bounded; numbers and
    booleans are not coerced (``true`` or ``"5"`` is not an integer; ``5`` is a float).

    Two kinds of job share this one schema: the built-in trainer (no ``entrypoint``) and a
    script job (``entrypoint`` set). A script job may not set the built-in trainer's fields
    (``model``, ``dataset``, ``epochs``, ``batch_size``, ``lr``, ``optimizer``, ``momentum``,
    ``weight_decay``, ``seed``, ``dataset_root``, ``download``, ``synthetic_samples``,
    ``checkpoint_every``, ``keep_checkpoints``); ``args``, ``env`` and ``secret_env`` need
    ``entrypoint``."""

    model_config = ConfigDict(extra="forbid", use_enum_values=False)

    name: JobName = Field(
        default="job", description="display name; letters, digits, '.', '_', '-'"
    )
    priority: int = Field(
        default=0,
        ge=PRIORITY_MIN,
        le=PRIORITY_MAX,
        description="higher runs first; equal priorities run in submission order",
    )
    labels: dict[LabelKey, LabelValue] = Field(
        default_factory=dict,
        max_length=LABELS_MAX,
        json_schema_extra=keys_by_name_pattern,
        description="free-form key → value tags; GET /jobs?label=key=value filters on them. "
        "Values are printable text (no control characters, DEL or U+2028/U+2029)",
    )
    model: ModelName = Field(default=ModelName.mlp, description="built-in trainer: the network")
    dataset: DatasetName = Field(
        default=DatasetName.digits,
        description="built-in trainer: the data; mnist, fashion_mnist and cifar10 are torchvision "
        "datasets read from dataset_root (or downloaded with download: true)",
    )
    epochs: int = Field(
        default=5, ge=1, le=100_000, description="built-in trainer: passes over the data"
    )
    batch_size: int = Field(
        default=64, ge=1, le=65_536, description="built-in trainer: samples per step, per rank"
    )
    lr: float = Field(
        default=0.05, gt=0, le=100, allow_inf_nan=False,
        description="built-in trainer: learning rate",
    )
    optimizer: OptimizerName = Field(
        default=OptimizerName.sgd, description="built-in trainer: the optimizer"
    )
    momentum: float = Field(
        default=0.0, ge=0, lt=1, allow_inf_nan=False,
        description="built-in trainer: SGD momentum (ignored by adam and adamw)",
    )
    weight_decay: float = Field(
        default=0.0, ge=0, le=1, allow_inf_nan=False,
        description="built-in trainer: L2 penalty / decoupled weight decay (adamw)",
    )
    seed: int = Field(
        default=0, ge=0, le=2**31 - 1,
        description="built-in trainer: seed of data shuffling and initialisation",
    )
    nproc_per_node: int = Field(
        default=1, ge=1, le=64,
        description="ranks (processes) to launch; each takes one GPU, or one CPU slot on CPU. "
        "Refused (422) when this host could never fit them",
    )
    nnodes: int = Field(
        default=1,
        ge=1,
        le=NNODES_MAX,
        description="nodes the job spans, nproc_per_node ranks on each (one torchrun per node); "
        "more than 1 needs the slurm executor (422 on the local one)",
    )
    partition: SlurmName | None = Field(
        default=None,
        description="slurm executor: partition to run in; null = TORCHYARD_SLURM_PARTITION, "
        "else the cluster's default. Refused (422) on the local executor",
    )
    account: SlurmName | None = Field(
        default=None,
        description="slurm executor: account to charge; null = TORCHYARD_SLURM_ACCOUNT, else "
        "the user's default. Refused (422) on the local executor",
    )
    qos: SlurmName | None = Field(
        default=None,
        description="slurm executor: quality of service; null = TORCHYARD_SLURM_QOS, else the "
        "default. Refused (422) on the local executor",
    )
    constraint: SlurmConstraint | None = Field(
        default=None,
        description="slurm executor: node features the nodes must have (Slurm's --constraint "
        "syntax: names joined by & | ,). Refused (422) on the local executor",
    )
    device: Device = Field(
        default=Device.auto, description="where ranks train; auto = cuda when GPUs are configured"
    )
    backend: Backend = Field(
        default=Backend.auto,
        description="torch.distributed backend; auto = nccl on cuda, gloo on cpu; nccl needs a GPU",
    )
    dataset_root: str | None = Field(
        default=None, max_length=4096,
        description="built-in trainer: local directory of a torchvision dataset, inside "
        "TORCHYARD_DATA_DIRS (refused with 422 otherwise)",
    )
    download: bool = Field(
        default=False, strict=True,
        description="built-in trainer: let torchvision download the dataset into dataset_root",
    )
    synthetic_samples: int = Field(
        default=2048, ge=16, le=10_000_000,
        description="built-in trainer: size of the synthetic dataset",
    )
    checkpoint_every: int = Field(
        default=1,
        ge=0,
        le=100_000,
        description="built-in trainer: epochs between checkpoints, plus one after the last epoch; "
        "0 = never",
    )
    keep_checkpoints: int = Field(
        default=2, ge=1, le=100,
        description="built-in trainer: newest checkpoints kept in RUN_DIR/checkpoints",
    )
    resume_from: int | None = Field(
        default=None,
        ge=1,
        le=2**62,
        description="id of an earlier job whose latest checkpoint this job starts from (422 when "
        "no such job exists)",
    )
    max_restarts: int = Field(
        default=0, ge=0, le=100,
        description="group restarts from the last checkpoint after a rank fails mid-training",
    )
    on_failure: list[FailureRule] = Field(
        default_factory=list,
        max_length=RULES_MAX,
        description="retry rules (exit_codes, signal and/or log_pattern → retry, fail or "
        "retry_elsewhere): the first matching a failing rank decides, then the defaults (CUDA "
        "OOM → fail; SIGKILL, NCCL/c10d timeouts → retry); retries count against max_restarts",
    )
    restart_backoff_s: float = Field(
        default=0, ge=0, le=BACKOFF_MAX_S, allow_inf_nan=False,
        description="seconds between a failed attempt and the next one; doubles after each "
        "restart, up to 10 times this value",
    )
    pause_grace_s: float = Field(
        default=60, gt=0, le=3600, allow_inf_nan=False,
        description="a pause (or preemption) sends the ranks SIGTERM; ranks still running this "
        "many seconds later are killed (the built-in trainer and worker.should_stop() stop at "
        "the next epoch's end with a checkpoint)",
    )
    preemptible: bool = Field(
        default=False, strict=True,
        description="a job of higher priority that cannot start otherwise may "
        "pause this one; it resumes on its own when there is room (docs/lifecycle.md)",
    )
    max_runtime_s: float | None = Field(
        default=None, gt=0, le=30 * 86400, allow_inf_nan=False,
        description="wall-clock limit for the whole job; the job fails with 'deadline exceeded'",
    )
    heartbeat_timeout_s: float | None = Field(
        default=600, gt=0, le=86400, allow_inf_nan=False,
        description="a rank with no training progress for this long fails the attempt; null = off",
    )
    entrypoint: str | None = Field(
        default=None,
        max_length=ENTRYPOINT_MAX,
        pattern=ENTRYPOINT_PATTERN,
        description="script job: 'path/to/script.py' inside TORCHYARD_SCRIPT_DIRS (no '..' "
        "segment), or '-m package.module'; null = the built-in trainer. Script jobs need API "
        "tokens (403 otherwise) and a file that exists (422 otherwise)",
    )
    package: str | None = Field(
        default=None,
        pattern=PACKAGE_PATTERN,
        description="script job: digest of uploaded code ('sha256:<hex>', from POST /packages); "
        "the entrypoint is then a path or module inside it, the ranks run in a copy of it (their "
        "working directory, first on sys.path) and TORCHYARD_SCRIPT_DIRS is not needed. 422 "
        "when the server does not hold it",
    )
    args: list[NoNul] = Field(
        default_factory=list, max_length=ARGS_MAX, description="script job: argv after the script"
    )
    env: dict[EnvName, EnvValue] = Field(
        default_factory=dict,
        max_length=ENV_MAX,
        json_schema_extra=keys_by_name_pattern,
        description="script job: extra environment of every rank (not TORCHYARD_*, torchrun's, "
        "PYTHON*, LD_*, PATH, SBATCH_*, SLURM_*, SRUN_*, SALLOC_*: 422 naming them); stored and "
        "shown to every reader, so never for secrets (use secret_env)",
    )
    secret_env: dict[EnvName, SecretName] = Field(
        default_factory=dict,
        max_length=ENV_MAX,
        json_schema_extra=keys_by_name_pattern,
        description="script job: variable → name of a secret in the server's "
        "TORCHYARD_SECRETS_FILE; the value reaches only the ranks' environment (docs/security.md)",
    )
    notify: list[WebhookName] = Field(
        default_factory=list,
        max_length=NOTIFY_MAX,
        description="names of webhook endpoints in the server's TORCHYARD_WEBHOOKS_FILE to tell "
        "of this job's state changes (running, succeeded, failed, cancelled, restarted, paused); an "
        "unknown name is 422. URLs never come from a spec (docs/webhooks.md)",
    )
    mlflow: MlflowField = Field(
        default=None,
        description="export to the server's MLflow tracking server (TORCHYARD_MLFLOW_TRACKING_URI; "
        "docs/tracking.md): null = as every job there; false = not this job; true or "
        "{experiment, log_outputs} = this job, with those options (422 where the server has none)",
    )
    nonfinite_patience: int | None = Field(
        default=1,
        ge=1,
        le=PATIENCE_MAX,
        description="stop the job (failed) when a rank reports a non-finite per-epoch 'loss' "
        "this many epochs in a row; null = off",
    )
    divergence_patience: int | None = Field(
        default=None,
        ge=1,
        le=PATIENCE_MAX,
        description="stop the job (failed) when the cross-rank loss summary flags the same rank "
        "as diverging this many epochs in a row; null = off",
    )

    @property
    def is_script(self) -> bool:
        """A user script (``entrypoint``) rather than the built-in trainer."""
        return self.entrypoint is not None

    @property
    def entrypoint_module(self) -> str | None:
        """``package.module`` for ``-m package.module``; None for a script path."""
        if self.entrypoint is not None and self.entrypoint.startswith("-m "):
            return self.entrypoint[3:]
        return None

    @model_validator(mode="before")
    @classmethod
    def _numbers_are_numbers(cls, data: object) -> object:
        refuse_coercion(data, NUMBER_FIELDS)
        return data

    @field_validator("entrypoint", mode="before")
    @classmethod
    def _entrypoint_syntax(cls, value: object) -> object:
        # Before the field's own pattern (ENTRYPOINT_PATTERN, the same rule): a clearer message.
        if not isinstance(value, str) or re.fullmatch(ENTRYPOINT_PATTERN, value):
            return value
        if ".." in value.split("/"):
            raise ValueError("must not contain '..'")
        raise ValueError(
            "must be 'path/to/script.py' (letters, digits, _ . + - /) or '-m package.module', "
            f"without spaces, quotes or shell syntax; got {value[:ENTRYPOINT_MAX]!r}"
        )

    @field_validator("env", "secret_env")
    @classmethod
    def _env_not_reserved(cls, value: dict[str, str]) -> dict[str, str]:
        if reserved := sorted(n for n in value if env_name_reserved(n)):
            raise ValueError(f"{', '.join(reserved)} cannot be set; reserved: {RESERVED_ENV_TEXT}")
        return value

    @classmethod
    def __get_pydantic_json_schema__(cls, core_schema, handler):  # type: ignore[no-untyped-def]
        """As a response, a spec carries every field (a script spec: all but the built-in
        trainer's; any spec: ``nnodes`` and the Slurm fields only when set), so the output schema
        requires them; as a request, defaulted fields are optional. FastAPI then publishes
        ``JobSpec-Input`` and ``JobSpec-Output``."""
        schema = handler(core_schema)
        target = handler.resolve_ref_schema(schema)
        if handler.mode == "serialization":
            optional = BUILTIN_ONLY_FIELDS | {"nnodes", "package", "mlflow", *SLURM_FIELDS}
            target["required"] = [n for n in cls.model_fields if n not in optional]
            target["title"] = "JobSpecOutput"  # generators name classes by title: no clash
        else:  # the model validators' rules, so a schema-valid spec is one they accept
            target["allOf"] = [
                {
                    "if": {"properties": {"entrypoint": {"type": "string"}},
                           "required": ["entrypoint"]},
                    "then": {"properties": dict.fromkeys(sorted(BUILTIN_ONLY_FIELDS), False)},
                    "else": {"properties": {"args": {"maxItems": 0}, "package": {"type": "null"},
                                            "env": {"maxProperties": 0},
                                            "secret_env": {"maxProperties": 0}}},
                },
                {"not": {"properties": {"backend": {"const": "nccl"},
                                        "device": {"const": "cpu"}},
                         "required": ["backend", "device"]}},
            ]
        return schema

    @model_serializer(mode="wrap")
    def _drop_builtin_fields(self, handler: SerializerFunctionWrapHandler):
        """A script spec is stored and shown without the built-in trainer's fields, so it
        validates again unchanged (those fields are forbidden next to ``entrypoint``)."""
        data = handler(self)
        if isinstance(data, dict):
            if data.get("nnodes") == 1:
                data.pop("nnodes")
            for name in (*SLURM_FIELDS, "package", "mlflow"):
                if data.get(name) is None:
                    data.pop(name, None)
        if self.is_script and isinstance(data, dict):
            for name in BUILTIN_ONLY_FIELDS:
                data.pop(name, None)
        return data

    @model_validator(mode="after")
    def _check_script(self) -> "JobSpec":
        if self.entrypoint is None:
            for name in ("args", "env", "secret_env", "package"):
                if getattr(self, name):
                    raise ValueError(f"{name}: only allowed with 'entrypoint' (a script job)")
            return self
        if self.package is not None and self.entrypoint.startswith("/"):
            raise ValueError("entrypoint: a path inside the package, not an absolute one")
        both = sorted(self.env.keys() & self.secret_env.keys())
        if both:
            raise ValueError(f"secret_env: {', '.join(both)} also set in 'env'; set it in one")
        given = sorted(self.model_fields_set & BUILTIN_ONLY_FIELDS)
        if given:
            raise ValueError(
                f"{given[0]}: not allowed with 'entrypoint' (a script takes its settings through "
                f"'args' and 'env'); built-in-only fields: {', '.join(sorted(BUILTIN_ONLY_FIELDS))}"
            )
        return self

    @model_validator(mode="after")
    def _check_combinations(self) -> "JobSpec":
        if self.dataset_root is not None and "\x00" in self.dataset_root:
            raise ValueError("dataset_root: must not contain NUL bytes")
        if self.backend is Backend.nccl and self.device is Device.cpu:
            raise ValueError("backend: 'nccl' needs device 'cuda' or 'auto', not 'cpu'")
        return self


NUMBER_FIELDS = frozenset(
    name for name, field in JobSpec.model_fields.items()
    if {int, float} & {field.annotation, *getattr(field.annotation, "__args__", ())}
)
