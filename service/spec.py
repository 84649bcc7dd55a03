"""The job spec: one pydantic model validated by the API and again by the worker.

This module is shared by ``service`` and ``worker`` and must stay free of torch imports.
"""

from __future__ import annotations

from enum import Enum
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator


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

    @model_validator(mode="after")
    def _check_combinations(self) -> JobSpec:
        if self.dataset_root is not None and "\x00" in self.dataset_root:
            raise ValueError("dataset_root: must not contain NUL bytes")
        if self.backend is Backend.nccl and self.device is Device.cpu:
            raise ValueError("backend: 'nccl' needs device 'cuda' or 'auto', not 'cpu'")
        if self.model is ModelName.resnet18 and self.dataset is DatasetName.synthetic:
            pass  # synthetic data is shaped per model by the worker
        return self
