"""The job spec: one pydantic model validated by the API and again by the worker.

Part of the contract (``torchyard_contract``): shared by ``service`` and ``worker``, free of torch,
FastAPI and SQLAlchemy imports.
"""

from __future__ import annotations

import re
from enum import Enum
from typing import Annotated

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    StringConstraints,
    field_validator,
    model_serializer,
    model_validator,
)


class ModelName(str, Enum):
    mlp = "mlp"
    cnn = "cnn"
    resnet18 = "resnet18"


class DatasetName(str, Enum):
    digits = "digits"
    synthetic = "synthetic"
    mnist = "mnist"
    fashion_mnist = "fashion_mnist"
    cifar10 = "cifar10"


class OptimizerName(str, Enum):
    sgd = "sgd"
    adam = "adam"
    adamw = "adamw"


class Device(str, Enum):
    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"


class Backend(str, Enum):
    auto = "auto"
    gloo = "gloo"
    nccl = "nccl"


JobName = Annotated[
    str, StringConstraints(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
]

LabelKey = Annotated[
    str, StringConstraints(min_length=1, max_length=63, pattern=r"^[A-Za-z0-9][A-Za-z0-9._/-]*$")
]
LabelValue = Annotated[str, StringConstraints(max_length=200, pattern=r"^[^\x00-\x1f]*$")]
PRIORITY_MIN, PRIORITY_MAX = -1000, 1000
LABELS_MAX = 32

# --- script jobs ----------------------------------------------------------------------------
# ``path/to/script.py`` (relative to a script directory, or absolute inside one) or
# ``-m package.module``. A strict character set: no whitespace tricks, quotes or shell syntax,
# even though nothing ever goes through a shell.
SCRIPT_PATH_PATTERN = r"^/?[A-Za-z0-9_][A-Za-z0-9_.+/-]*\.py$"
MODULE_PATTERN = r"^-m [A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$"
ENTRYPOINT_MAX = 1024
ARGS_MAX, ARG_LEN_MAX = 256, 4096
ENV_MAX, ENV_VALUE_LEN_MAX = 64, 4096
ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
# torchyard's and torchrun's own variables, and those that would make Python or the dynamic
# loader run code from outside the script directories, cannot be set by a job.
RESERVED_ENV_PREFIXES = ("TORCHYARD_", "TORCHELASTIC_", "PYTHON", "LD_", "ROLE_", "GROUP_")
RESERVED_ENV_NAMES = frozenset({
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
    "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "TORCH_NCCL_ASYNC_ERROR_HANDLING",
})
ALLOWED_PYTHON_ENV = frozenset({"PYTHONHASHSEED", "PYTHONFAULTHANDLER", "PYTHONDONTWRITEBYTECODE"})

NoNul = Annotated[str, StringConstraints(max_length=ARG_LEN_MAX, pattern=r"^[^\x00]*$")]
EnvName = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=ENV_NAME_PATTERN)]
EnvValue = Annotated[str, StringConstraints(max_length=ENV_VALUE_LEN_MAX, pattern=r"^[^\x00]*$")]
# The name of a secret in the server's secrets file (service.secretstore), never its value.
SecretName = Annotated[
    str, StringConstraints(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
]
PATIENCE_MAX = 10_000


def env_name_reserved(name: str) -> bool:
    """True for a variable torchyard or torchrun sets, or one that loads code (PYTHON*, LD_*)."""
    if name in ALLOWED_PYTHON_ENV:
        return False
    return name in RESERVED_ENV_NAMES or name.startswith(RESERVED_ENV_PREFIXES)


TORCHVISION_DATASETS = {DatasetName.mnist, DatasetName.fashion_mnist, DatasetName.cifar10}


class JobSpec(BaseModel):
    """What a user asks for. Unknown fields are rejected; every number is bounded."""

    model_config = ConfigDict(extra="forbid", use_enum_values=False)

    name: JobName = "job"
    priority: int = Field(
        default=0,
        ge=PRIORITY_MIN,
        le=PRIORITY_MAX,
        description="higher runs first; equal priorities run in submission order",
    )
    labels: dict[LabelKey, LabelValue] = Field(
        default_factory=dict,
        max_length=LABELS_MAX,
        description="free-form key → value tags; GET /jobs?label=key=value filters on them",
    )
    model: ModelName = ModelName.mlp
    dataset: DatasetName = DatasetName.digits
    epochs: int = Field(default=5, ge=1, le=100_000)
    batch_size: int = Field(default=64, ge=1, le=65_536, description="per rank")
    lr: float = Field(default=0.05, gt=0, le=100, allow_inf_nan=False)
    optimizer: OptimizerName = OptimizerName.sgd
    momentum: float = Field(default=0.0, ge=0, lt=1, allow_inf_nan=False)
    weight_decay: float = Field(default=0.0, ge=0, le=1, allow_inf_nan=False)
    seed: int = Field(default=0, ge=0, le=2**31 - 1)
    nproc_per_node: int = Field(default=1, ge=1, le=64)
    device: Device = Device.auto
    backend: Backend = Backend.auto
    dataset_root: str | None = Field(
        default=None, max_length=4096, description="local directory of a torchvision dataset"
    )
    download: bool = False
    synthetic_samples: int = Field(default=2048, ge=16, le=10_000_000)
    checkpoint_every: int = Field(
        default=1,
        ge=0,
        le=100_000,
        description="epochs between checkpoints, plus one after the last epoch; 0 = never",
    )
    keep_checkpoints: int = Field(
        default=2, ge=1, le=100, description="newest checkpoints kept in RUN_DIR/checkpoints"
    )
    resume_from: int | None = Field(
        default=None,
        ge=1,
        le=2**62,
        description="id of an earlier job whose latest checkpoint this job starts from",
    )
    max_restarts: int = Field(
        default=0,
        ge=0,
        le=100,
        description="group restarts from the last checkpoint after a rank fails mid-training",
    )
    max_runtime_s: float | None = Field(
        default=None,
        gt=0,
        le=30 * 86400,
        allow_inf_nan=False,
        description="wall-clock limit for the whole job; the job fails with 'deadline exceeded'",
    )
    heartbeat_timeout_s: float | None = Field(
        default=600,
        gt=0,
        le=86400,
        allow_inf_nan=False,
        description="a rank with no training progress for this long fails the attempt; null = off",
    )
    entrypoint: str | None = Field(
        default=None,
        max_length=ENTRYPOINT_MAX,
        description="script job: 'path/to/script.py' inside TORCHYARD_SCRIPT_DIRS, or "
        "'-m package.module'; null = the built-in trainer",
    )
    args: list[NoNul] = Field(
        default_factory=list, max_length=ARGS_MAX, description="script job: argv after the script"
    )
    env: dict[EnvName, EnvValue] = Field(
        default_factory=dict,
        max_length=ENV_MAX,
        description="script job: extra environment of every rank (not TORCHYARD_*, torchrun's, "
        "PYTHON*, LD_*); stored and shown to every reader, so never for secrets (use secret_env)",
    )
    secret_env: dict[EnvName, SecretName] = Field(
        default_factory=dict,
        max_length=ENV_MAX,
        description="script job: variable → name of a secret in the server's "
        "TORCHYARD_SECRETS_FILE; the value reaches only the ranks' environment (docs/security.md)",
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

    @field_validator("entrypoint")
    @classmethod
    def _entrypoint_syntax(cls, value: str | None) -> str | None:
        if value is None:
            return value
        if not (re.fullmatch(SCRIPT_PATH_PATTERN, value) or re.fullmatch(MODULE_PATTERN, value)):
            raise ValueError(
                "must be 'path/to/script.py' (letters, digits, _ . + - /) or '-m package.module', "
                f"without spaces, quotes or shell syntax; got {value!r}"
            )
        if ".." in value.split("/"):
            raise ValueError("must not contain '..'")
        return value

    @field_validator("env", "secret_env")
    @classmethod
    def _env_not_reserved(cls, value: dict[str, str]) -> dict[str, str]:
        reserved = sorted(n for n in value if env_name_reserved(n))
        if reserved:
            raise ValueError(
                f"{', '.join(reserved)} cannot be set (TORCHYARD_*, torchrun's variables, "
                "PYTHON* and LD_* are reserved)"
            )
        return value

    @model_serializer(mode="wrap")
    def _drop_builtin_fields(self, handler: SerializerFunctionWrapHandler):
        """A script spec is stored and shown without the built-in trainer's fields, so it
        validates again unchanged (those fields are forbidden next to ``entrypoint``)."""
        data = handler(self)
        if self.is_script and isinstance(data, dict):
            for name in BUILTIN_ONLY_FIELDS:
                data.pop(name, None)
        return data

    @model_validator(mode="after")
    def _check_script(self) -> JobSpec:
        if self.entrypoint is None:
            for name in ("args", "env", "secret_env"):
                if getattr(self, name):
                    raise ValueError(f"{name}: only allowed with 'entrypoint' (a script job)")
            return self
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
    def _check_combinations(self) -> JobSpec:
        if self.dataset_root is not None and "\x00" in self.dataset_root:
            raise ValueError("dataset_root: must not contain NUL bytes")
        if self.backend is Backend.nccl and self.device is Device.cpu:
            raise ValueError("backend: 'nccl' needs device 'cuda' or 'auto', not 'cpu'")
        if self.model is ModelName.resnet18 and self.dataset is DatasetName.synthetic:
            pass  # synthetic data is shaped per model by the worker
        return self


# Fields only the built-in trainer reads; a script job (``entrypoint``) may not set them.
BUILTIN_ONLY_FIELDS = frozenset({
    "model", "dataset", "epochs", "batch_size", "lr", "optimizer", "momentum", "weight_decay",
    "seed", "dataset_root", "download", "synthetic_samples", "checkpoint_every",
    "keep_checkpoints",
})
