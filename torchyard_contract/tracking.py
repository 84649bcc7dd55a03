"""The job spec's ``mlflow`` field: whether and how a job is exported to MLflow.

Part of the contract (``torchyard_contract``); the export itself is the server's
(``service.domain.tracking``, docs/tracking.md).
"""

from typing import Annotated

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    StrictBool,
    StringConstraints,
    Tag,
)

from torchyard_contract.spec_types import LABEL_VALUE_CHARS

EXPERIMENT_MAX = 256
# An MLflow experiment name: printable text (no control characters), as a label value is.
ExperimentName = Annotated[
    str, StringConstraints(min_length=1, max_length=EXPERIMENT_MAX,
                           pattern=rf"^{LABEL_VALUE_CHARS}+$")
]


class MlflowOptions(BaseModel):
    """``"mlflow": {...}`` in a spec: this job is exported, with these options."""

    model_config = ConfigDict(extra="forbid")

    experiment: ExperimentName | None = Field(
        default=None,
        description="MLflow experiment of the job's run (created if missing); null = the "
        "job's team when it has one, else 'torchyard'",
    )
    log_outputs: StrictBool = Field(
        default=False,
        description="when the job ends, upload its output directory (TORCHYARD_OUTPUT_DIR) as "
        "the run's artifacts, at most TORCHYARD_MLFLOW_MAX_ARTIFACT_BYTES",
    )


# ``mlflow`` of a spec: null = as the server exports every job; false = not this job; true or
# an object = this job (refused where the server has no MLflow tracking server).
# An object is read as the options and anything else as the flag, so an error names the one
# meant ("mlflow.options.experiment: ..."), not every way the value could have been read.
MlflowField = Annotated[
    Annotated[StrictBool, Tag("flag")] | Annotated[MlflowOptions, Tag("options")],
    Discriminator(lambda v: "options" if isinstance(v, dict | MlflowOptions) else "flag"),
] | None


def mlflow_options(value: MlflowField) -> MlflowOptions | None:
    """The options of an exported job, or None for ``false`` (not exported)."""
    if value is False:
        return None
    return value if isinstance(value, MlflowOptions) else MlflowOptions()
