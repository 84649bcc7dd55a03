"""The job spec's vocabulary: enumerations, bounds, patterns and small checks its fields use.

Part of the contract (``torchyard_contract``): imported by :mod:`torchyard_contract.spec` (the
model) and by whoever needs one bound or name without the whole model (the Slurm script writer,
the settings, the records model).
"""

from enum import Enum
from typing import Annotated

from pydantic import BeforeValidator, StringConstraints


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


# Slurm names (partition, account, QOS) and node-feature expressions (constraint): what Slurm
# accepts, minus anything a shell or an #SBATCH line could read as syntax. Never free-form flags.
SLURM_NAME_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$"
SLURM_CONSTRAINT_PATTERN = r"^[A-Za-z0-9_.&|,()\[\]*-]{1,256}$"
SlurmName = Annotated[str, StringConstraints(pattern=SLURM_NAME_PATTERN)]
SlurmConstraint = Annotated[str, StringConstraints(pattern=SLURM_CONSTRAINT_PATTERN)]
NNODES_MAX = 1024
# Fields that only the Slurm executor reads; left out of a stored spec while unset, so a spec
# that does not use them looks (and validates) as it did before they existed.
SLURM_FIELDS = ("partition", "account", "qos", "constraint")


def _a_number(value: object) -> object:
    if isinstance(value, bool | str | bytes):
        # ValueError, not TypeError: pydantic reports only the former as a validation error.
        raise ValueError(f"must be a number, not {type(value).__name__} {value!r:.40}")  # noqa: TRY004
    return value


# A field's number as refuse_coercion takes it (5.0 is 5; true and "5" are refused), for models
# that mark the field rather than list it: ``Annotated[int, NUMBER_ONLY]``.
NUMBER_ONLY = BeforeValidator(_a_number)


def refuse_coercion(data: object, numbers: frozenset[str]) -> None:
    """Numbers are numbers: ``true`` or ``"5"`` for a field in ``numbers`` is refused, not coerced
    (pydantic's lax mode would take them). ``5.0`` is still the integer 5, as JSON Schema's
    ``integer`` counts it (and JavaScript sends it), and ``5`` a valid float. Raises
    ``ValueError("<field>: ...")``."""
    if not isinstance(data, dict):
        return
    for name in sorted(numbers & data.keys()):
        # A list of numbers (a retry rule's exit_codes) holds numbers too.
        for value in data[name] if isinstance(data[name], list) else [data[name]]:
            try:
                _a_number(value)
            except ValueError as exc:
                raise ValueError(f"{name}: {exc}") from None


JobName = Annotated[
    str, StringConstraints(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
]

LabelKey = Annotated[
    str, StringConstraints(min_length=1, max_length=63, pattern=r"^[A-Za-z0-9][A-Za-z0-9._/-]*$")
]
# Printable: no C0/C1 control characters, DEL, or the Unicode line/paragraph separators.
LABEL_VALUE_CHARS = r"[^\x00-\x1f\x7f-\x9f\u2028\u2029]"
LABEL_VALUE_MAX = 200
LabelValue = Annotated[
    str, StringConstraints(max_length=LABEL_VALUE_MAX, pattern=rf"^{LABEL_VALUE_CHARS}*$")
]
PRIORITY_MIN, PRIORITY_MAX = -1000, 1000
LABELS_MAX = 32

# --- script jobs ----------------------------------------------------------------------------
# ``path/to/script.py`` (relative to a script directory, or absolute inside one) or
# ``-m package.module``. A strict character set: no whitespace tricks, quotes or shell syntax,
# even though nothing ever goes through a shell.
SCRIPT_PATH_PATTERN = r"^/?[A-Za-z0-9_][A-Za-z0-9_.+/-]*\.py$"
MODULE_PATTERN = r"^-m [A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$"
# Both of the above in one pattern for the schema, with no path segment equal to '..' (spelled
# without look-arounds so every JSON Schema tool and fuzzer can use it).
_C, _N = r"[A-Za-z0-9_.+-]", r"[A-Za-z0-9_+-]"
_SEGMENT = rf"(?:\.?\.?{_N}{_C}*|\.\.\.{_C}*|\.?)"  # any run of path characters but '..'
ENTRYPOINT_PATTERN = (
    rf"^(?:/?[A-Za-z0-9_]{_C}*(?:/{_SEGMENT})*(?:/\.\.)?\.py"
    r"|-m [A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)$"
)
ENTRYPOINT_MAX = 1024
PACKAGE_PATTERN = r"^sha256:[0-9a-f]{64}$"  # a package's digest (POST /packages)
ARGS_MAX, ARG_LEN_MAX = 256, 4096
ENV_MAX, ENV_VALUE_LEN_MAX = 64, 4096
ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
# torchyard's and torchrun's own variables, those that would make Python or the dynamic
# loader run code from outside the script directories, and those that steer the programs the
# server and the attempt loop run (PATH: which program a name is; Slurm's input variables, which
# override its options and the batch script's), cannot be set by a job.
RESERVED_ENV_PREFIXES = (
    "TORCHYARD_", "TORCHELASTIC_", "PYTHON", "LD_", "ROLE_", "GROUP_",
    "SBATCH_", "SLURM_", "SRUN_", "SALLOC_",
)
RESERVED_ENV_NAMES = frozenset({
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
    "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "PATH",
})
# The reserved set in words, for error messages and field descriptions.
RESERVED_ENV_TEXT = (
    "TORCHYARD_*, TORCHELASTIC_*, torchrun's (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, "
    "MASTER_ADDR, MASTER_PORT, ROLE_*, GROUP_*), CUDA_VISIBLE_DEVICES, OMP_NUM_THREADS, "
    "TORCH_NCCL_ASYNC_ERROR_HANDLING, PYTHON* (but PYTHONHASHSEED, PYTHONFAULTHANDLER, "
    "PYTHONDONTWRITEBYTECODE), LD_*, PATH, SBATCH_*, SLURM_*, SRUN_*, SALLOC_*"
)
ALLOWED_PYTHON_ENV = frozenset({"PYTHONHASHSEED", "PYTHONFAULTHANDLER", "PYTHONDONTWRITEBYTECODE"})

NoNul = Annotated[str, StringConstraints(max_length=ARG_LEN_MAX, pattern=r"^[^\x00]*$")]
EnvName = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=ENV_NAME_PATTERN)]
EnvValue = Annotated[str, StringConstraints(max_length=ENV_VALUE_LEN_MAX, pattern=r"^[^\x00]*$")]
# The name of a secret in the server's secrets file (service.domain.intake.secretstore), never its value.
SecretName = Annotated[
    str, StringConstraints(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
]
PATIENCE_MAX = 10_000
# The name of a webhook endpoint in the server's webhooks file (service.settings.webhookfile);
# a job names endpoints, never URLs.
WebhookName = Annotated[
    str, StringConstraints(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
]
NOTIFY_MAX = 16


def keys_by_name_pattern(schema: dict) -> None:
    """JSON Schema of a ``dict[Key, Value]``: pydantic writes the key pattern as
    ``patternProperties``, which leaves other keys unconstrained; say it as ``propertyNames``."""
    patterns = schema.pop("patternProperties", None)
    if patterns:
        (pattern, value_schema), = patterns.items()
        schema.setdefault("propertyNames", {})["pattern"] = pattern
        schema["additionalProperties"] = value_schema


def env_name_reserved(name: str) -> bool:
    """True for a variable torchyard or torchrun sets, one that loads code (PYTHON*, LD_*), or
    one that steers the programs torchyard runs (PATH; Slurm's SBATCH_*, SLURM_*, SRUN_*,
    SALLOC_*)."""
    if name in ALLOWED_PYTHON_ENV:
        return False
    return name in RESERVED_ENV_NAMES or name.startswith(RESERVED_ENV_PREFIXES)

# Fields only the built-in trainer reads; a script job (``entrypoint``) may not set them.
BUILTIN_ONLY_FIELDS = frozenset({
    "model", "dataset", "epochs", "batch_size", "lr", "optimizer", "momentum", "weight_decay",
    "seed", "dataset_root", "download", "synthetic_samples", "checkpoint_every",
    "keep_checkpoints",
})
