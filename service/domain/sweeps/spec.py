"""A sweep's request (``POST /sweeps``): the base job spec, the search space, the method, the
early-stopping rule, the objective and the limits; and each trial's job spec built from it.

A space key names either a field of the job spec (``lr``, ``batch_size``, ``nproc_per_node``…),
set in each trial's spec, or — script jobs only — a script parameter, which reaches the script
through ``{name}`` placeholders in ``args`` and, for every trial, the ``TORCHYARD_PARAMS``
mapping the SDK reads (``worker.params()``). Every refusal names its field
(``space.lr: …``), so the API answers 422 naming it.
"""

import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from service.domain.sweeps.grid import GRID_POINTS_MAX, grid_size, too_big, trial_point
from torchyard_contract.spec import BUILTIN_ONLY_FIELDS, JobSpec
from torchyard_contract.spec_types import LABELS_MAX, JobName, keys_by_name_pattern

PARAM_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]{0,63}$"
PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]{0,63})\}")
SPACE_MAX = 32
CHOICES_MAX = 256
MAX_TRIALS_MAX = 10_000
PARALLEL_MAX = 256
SWEEP_LABEL = "sweep"
METRIC_PATTERN = r"^[A-Za-z0-9_.:/-]{1,64}$"
# Job-spec fields a space may not search: they name the job or its code, not a setting of it.
NOT_SEARCHABLE = frozenset({"name", "labels", "entrypoint", "args", "env", "secret_env",
                            "resume_from", "dataset_root"})

Number = Annotated[float, Field(allow_inf_nan=False)]
Choice = bool | int | float | str


class _Dim(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ChoiceDim(_Dim):
    type: Literal["choice"]
    values: list[Choice] = Field(min_length=1, max_length=CHOICES_MAX)

    def grid_count(self) -> int:
        return len(self.values)

    def grid_value(self, digit: int) -> Choice:
        return self.values[digit]


class UniformDim(_Dim):
    type: Literal["uniform"]
    low: Number
    high: Number

    @model_validator(mode="after")
    def _ordered(self) -> "UniformDim":
        if not self.low < self.high:
            raise ValueError(f"low ({self.low}) must be below high ({self.high})")
        return self

    def grid_count(self) -> int:
        return 0  # continuous: not a grid dimension

    def grid_value(self, digit: int) -> float:
        raise ValueError(f"a {self.type} dimension has no grid values")


class LogUniformDim(UniformDim):
    type: Literal["log_uniform"]  # type: ignore[assignment]
    low: Number = Field(gt=0)


class IntDim(_Dim):
    type: Literal["int"]
    low: int = Field(ge=-(2**31), le=2**31)
    high: int = Field(ge=-(2**31), le=2**31)
    step: int = Field(default=1, ge=1)
    log: bool = False

    @model_validator(mode="after")
    def _ordered(self) -> "IntDim":
        if not self.low <= self.high:
            raise ValueError(f"low ({self.low}) must not be above high ({self.high})")
        if self.log and (self.low < 1 or self.step != 1):
            raise ValueError("log: needs low >= 1 and step 1")
        return self

    def grid_count(self) -> int:
        return (self.high - self.low) // self.step + 1  # never expanded: ±2^31 is one division

    def grid_value(self, digit: int) -> int:
        return self.low + digit * self.step


Dimension = Annotated[ChoiceDim | UniformDim | LogUniformDim | IntDim, Field(discriminator="type")]


class AshaRule(_Dim):
    """Asynchronous successive halving (Optuna's ``SuccessiveHalvingPruner``): at epochs
    ``min_epochs × reduction_factor^k`` a trial goes on only if it is in the best
    ``1/reduction_factor`` of the trials that reached that epoch (rung)."""

    type: Literal["asha"]
    min_epochs: int = Field(default=1, ge=1, le=100_000)
    reduction_factor: int = Field(default=3, ge=2, le=100)


class MedianRule(_Dim):
    """Optuna's ``MedianPruner``: a trial stops when its value at an epoch is worse than the
    median of the other trials' values at that epoch."""

    type: Literal["median"]
    startup_trials: int = Field(default=2, ge=0, le=10_000)
    warmup_epochs: int = Field(default=0, ge=0, le=100_000)


PruneRule = Annotated[AshaRule | MedianRule, Field(discriminator="type")]


class Objective(BaseModel):
    model_config = ConfigDict(extra="forbid")

    metric: str = Field(default="loss", pattern=METRIC_PATTERN,
                        description="the per-epoch metric every rank reports")
    mode: Literal["min", "max"] = "min"
    reduce: Literal["mean", "min", "max"] = Field(
        default="mean", description="how one epoch's values of every rank become one value")


class SweepSpec(BaseModel):
    """A sweep: ``max_trials`` jobs of ``spec``, each with parameters drawn from ``space`` by
    ``method``, at most ``parallel`` of them queued or running at once."""

    model_config = ConfigDict(extra="forbid")

    name: JobName = Field(default="sweep", description="trials are named '<name>-<n>'")
    spec: JobSpec = Field(description="the base job spec every trial starts from; its "
                          "priority is the sweep's")
    space: dict[Annotated[str, Field(pattern=PARAM_PATTERN)], Dimension] = Field(
        min_length=1, max_length=SPACE_MAX, json_schema_extra=keys_by_name_pattern,
        description="parameter name → dimension. A name is a searchable field of the built-in "
        "trainer's spec (a script job's names are its own parameters, {name} in args); low is "
        f"below high; grid takes choice and int dimensions only, {GRID_POINTS_MAX:,} points at "
        "most (422 when the sweep is created)")
    method: Literal["grid", "random", "tpe"] = "random"
    prune: PruneRule | None = None
    objective: Objective = Field(default_factory=Objective)
    max_trials: int | None = Field(
        default=None, ge=1, le=MAX_TRIALS_MAX,
        description="trials in all, at most the grid's size (grid); null = the grid's size "
        "(grid) or 10")
    parallel: int = Field(default=1, ge=1, le=PARALLEL_MAX,
                          description="trials queued or running at once, at most")
    max_failures: int | None = Field(
        default=None, ge=1, le=MAX_TRIALS_MAX,
        description="the sweep fails once this many trials failed; null = never")
    seed: int = Field(default=0, ge=0, le=2**31 - 1)

    @model_validator(mode="after")
    def _check(self) -> "SweepSpec":
        script = self.spec.is_script
        for key, dim in self.space.items():
            if self.sets_field(key):
                if key in NOT_SEARCHABLE:
                    raise ValueError(f"space.{key}: not a searchable spec field")
                for value in extremes(dim):
                    self._check_value(key, value)
            elif not script:
                raise ValueError(
                    f"space.{key}: unknown field: not a field of the built-in trainer's spec "
                    "(script parameters need a script job, 'entrypoint')")
        for i, arg in enumerate(self.spec.args):
            for name in PLACEHOLDER.findall(arg):
                if name not in self.space:
                    raise ValueError(f"spec.args.{i}: placeholder {{{name}}} is not in 'space' "
                                     f"(defined: {', '.join(sorted(self.space))})")
        if self.method == "grid":
            for key, dim in self.space.items():
                if not isinstance(dim, ChoiceDim | IntDim):
                    raise ValueError(f"space.{key}.type: grid needs 'choice' or 'int' "
                                     f"dimensions, not {dim.type!r}")
            size = grid_size(self.space)
            if self.max_trials is not None and self.max_trials > size:
                raise ValueError(f"max_trials: {self.max_trials} is more than the grid's "
                                 f"{size} points")
        return self

    def grid_refused(self) -> str | None:
        """Why this server refuses the sweep's grid (over ``GRID_POINTS_MAX`` points), or None.
        Checked when a sweep is created and when its study is built, not by the model, so a
        sweep stored before the bound still reads (``service.domain.sweeps.grid``)."""
        return too_big(self.space) if self.method == "grid" else None

    def grid_params(self, k: int) -> dict[str, Choice]:
        """Grid trial ``k``'s parameters (0-based, in the order the seed shuffles the grid)."""
        return trial_point(self.space, self.seed, k)

    def sets_field(self, key: str) -> bool:
        """True when space key ``key`` sets a field of the job spec; False for a script
        parameter (a script's spec has none of the built-in trainer's fields: ``lr`` of a
        script sweep is the script's)."""
        if key not in JobSpec.model_fields:
            return False
        return not (self.spec.is_script and key in BUILTIN_ONLY_FIELDS)

    def _check_value(self, key: str, value: Choice) -> None:
        base = self.spec.model_dump(mode="json")
        try:
            JobSpec.model_validate({**base, key: value})
        except ValidationError as exc:
            msg = exc.errors()[0]["msg"].removeprefix("Value error, ")
            raise ValueError(f"space.{key}: {value!r} is refused by the job spec: {msg}") from None

    @property
    def trials_total(self) -> int:
        if self.max_trials is not None:
            return self.max_trials
        return grid_size(self.space) if self.method == "grid" else 10

    def trial_spec(self, sweep_id: int, number: int, params: Mapping[str, Any]) -> JobSpec:
        """Trial ``number``'s job spec: the spec fields of ``params`` set, the placeholders
        of ``args`` filled, named '<sweep name>-<number>', labelled ``sweep=<id>``."""
        data = self.spec.model_dump(mode="json")
        data.update({k: v for k, v in params.items() if self.sets_field(k)})
        data["args"] = [PLACEHOLDER.sub(lambda m: _text(params[m[1]]), a) for a in data["args"]]
        data["name"] = f"{self.name}-{number}"[:100]
        labels = dict(data.get("labels") or {})
        if len(labels) < LABELS_MAX:
            labels.setdefault(SWEEP_LABEL, str(sweep_id))
        data["labels"] = labels
        return JobSpec.model_validate(data)


def _text(value: Choice) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def extremes(dim: Any) -> list[Choice]:
    """The values of a dimension that bound what the spec must accept."""
    if isinstance(dim, ChoiceDim):
        return list(dim.values)
    if isinstance(dim, IntDim):
        return [dim.low, dim.high]
    return [dim.low, dim.high]
