"""What the Slurm executor runs, as pure functions: the batch script, the ``sbatch`` argv, the
cleaned ``sbatch`` environment, the job's own variables as ``sbatch`` reads them
(``--export-file``) and each attempt's ``srun`` argv. Nothing here starts a process, so a dry run
prints exactly what ``submit`` would do, and tests read it as text.

The shape of a Slurm job (one per torchyard job, named ``ty-<id>``):

* the batch script runs on the allocation's first node (the batch host) and ``exec``s the
  job's attempt loop (``python -m service.run.attemptloop --launcher=slurm RUN_DIR``), so the script's exit
  code is the attempt loop's, which is the last attempt's real exit code;
* each attempt is one job step: ``srun --kill-on-bad-exit=1`` starts one ``torchrun`` per node
  (``--nnodes``, ``--node-rank=$SLURM_NODEID``) with a static rendezvous on the batch host at a
  port the attempt loop picked there — so global rank 0 is always on the batch host;
* each node's torchrun writes its ranks' logs under ``logs/attempt-<n>/node-<k>/`` and the node's
  name to ``logs/attempt-<n>/node-<k>/node``; its own output goes to ``…/node-<k>.log``.

Every value that reaches a ``#SBATCH`` line is validated (``SLURM_NAME_PATTERN``; node names:
``torchyard_contract.nodes``) before it gets here; a job can never add free-form ``sbatch`` flags.
A job restarted elsewhere (``retry_elsewhere``) leaves out the nodes it failed on: ``--exclude``.
"""

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from torchyard_contract.launch import RunAs
from torchyard_contract.nodes import EXCLUDE_NODES_MAX, is_node_name
from torchyard_contract.spec_types import SLURM_CONSTRAINT_PATTERN, SLURM_NAME_PATTERN

# Seconds on top of max_runtime_s before Slurm's own --time ends the allocation: the attempt
# loop enforces the deadline itself (SIGTERM → grace → SIGKILL); Slurm's limit is the backstop.
TIME_LIMIT_MARGIN_S = 60.0
# Variables of the server's environment an sbatch call (and so the job) may keep: enough to find
# programs and the Slurm configuration, nothing the server was given (tokens, database URL). The
# job's own variables never join them: sbatch reads those from its --export-file, and a job can
# name neither PATH nor Slurm's input variables (torchyard_contract.spec reserves them).
# PYTHONPATH: where the server's python finds torchyard (and, in the test suite, the rank hooks
# of tests/rankhooks/sitecustomize.py) reaches the nodes as it reaches a local job.
KEPT_ENV = (
    "PATH", "PYTHONPATH", "LANG", "LC_ALL", "TZ", "HOME", "USER", "LOGNAME", "SLURM_CONF",
)
# The test hooks' settings pass through as they do to a local job, so the test suite can drive a
# Slurm job as it drives a local one; they hold no secret.
KEPT_PREFIXES = ("TORCHYARD_TEST_",)
NODE_LOG_DIR = "node-{k}"  # per node, under logs/attempt-<n>/


def job_name(job_id: int) -> str:
    return f"ty-{int(job_id)}"


def job_id_from_name(name: str) -> int | None:
    m = re.fullmatch(r"ty-(\d+)", name)
    return int(m.group(1)) if m else None


@dataclass(frozen=True)
class BatchRequest:
    """One torchyard job as a Slurm allocation. ``gpus_per_node`` > 0 asks for GPUs (a GPU
    partition); otherwise ``cpus_per_node`` CPUs (one per rank) on each node."""

    job_id: int
    run_dir: Path
    python: str
    nnodes: int
    nproc_per_node: int
    gpus_per_node: int = 0
    max_runtime_s: float | None = None
    stop_grace_s: float = 10.0
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    # Nodes the job leaves out (``--exclude``): where its ranks failed before (retry_elsewhere).
    exclude: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in ("partition", "account", "qos"):
            value = getattr(self, name)
            if value is not None and not re.fullmatch(SLURM_NAME_PATTERN, value):
                raise ValueError(f"{name}: {value!r} is not a Slurm name ({SLURM_NAME_PATTERN})")
        if self.constraint is not None and not re.fullmatch(
            SLURM_CONSTRAINT_PATTERN, self.constraint
        ):
            raise ValueError(f"constraint: {self.constraint!r} is not a Slurm feature expression")
        if len(self.exclude) > EXCLUDE_NODES_MAX:
            raise ValueError(f"exclude: {len(self.exclude)} nodes, at most {EXCLUDE_NODES_MAX}")
        for node in self.exclude:
            if not is_node_name(node):
                raise ValueError(f"exclude: {node[:80]!r} is not a node name")
        if any(c.isspace() for c in str(self.run_dir)):
            raise ValueError(f"run directory {self.run_dir} contains whitespace")


def time_limit(max_runtime_s: float | None, stop_grace_s: float) -> str | None:
    """``--time`` in Slurm's ``D-HH:MM:SS`` (whole minutes, rounded up); None = the partition's."""
    if max_runtime_s is None:
        return None
    minutes = math.ceil((max_runtime_s + stop_grace_s + TIME_LIMIT_MARGIN_S) / 60)
    days, rest = divmod(minutes, 24 * 60)
    return f"{days}-{rest // 60:02d}:{rest % 60:02d}:00"


def sbatch_directives(req: BatchRequest) -> list[str]:
    """The ``#SBATCH`` options, in a fixed order."""
    opts = [
        f"--job-name={job_name(req.job_id)}",
        f"--nodes={req.nnodes}",
        "--ntasks-per-node=1",  # one torchrun per node; it starts the node's ranks
        f"--chdir={req.run_dir}",
        f"--output={req.run_dir}/logs/batch.log",
        "--open-mode=append",
        "--kill-on-invalid-dep=yes",
        "--no-requeue",  # a requeued job would rerun from scratch behind the attempt loop's back
    ]
    if req.gpus_per_node:
        opts += [f"--gpus-per-node={req.gpus_per_node}", f"--cpus-per-task={req.gpus_per_node}"]
    else:
        opts.append(f"--cpus-per-task={req.nproc_per_node}")
    if (limit := time_limit(req.max_runtime_s, req.stop_grace_s)) is not None:
        opts.append(f"--time={limit}")
    for name in ("partition", "account", "qos", "constraint"):
        if (value := getattr(req, name)) is not None:
            opts.append(f"--{name}={value}")
    if req.exclude:
        opts.append(f"--exclude={','.join(req.exclude)}")
    return opts


def attempt_loop_argv(python: str, run_dir: Path) -> list[str]:
    """The attempt loop, as the batch script starts it."""
    return [python, "-m", "service.run.attemptloop", "--launcher=slurm", str(run_dir)]


def _sh_quote(word: str) -> str:
    return "'" + word.replace("'", "'\\''") + "'"


def build_batch_script(req: BatchRequest) -> str:
    """The batch script ``sbatch`` reads; pure. It holds no secret: the job token reaches the
    job only through ``sbatch``'s export file (``export_file_content``)."""
    directives = "\n".join(f"#SBATCH {opt}" for opt in sbatch_directives(req))
    command = " ".join(_sh_quote(w) for w in attempt_loop_argv(req.python, req.run_dir))
    return (
        "#!/bin/sh\n"
        f"{directives}\n"
        f"# torchyard job {req.job_id}: the attempt loop runs on this (the batch) host and starts\n"
        "# each attempt on every node with srun; exec, so this script exits with its exit code,\n"
        "# the last attempt's own (a script ending in srun would report 0:0 whatever a rank did).\n"
        f"exec {command}\n"
    )


def build_sbatch_command(
    sbatch: str, script_path: Path, export_fd: int | str = "<fd>", run_as: RunAs | None = None,
) -> list[str]:
    """``SBATCH --parsable --export-file=FD [--uid=USER --gid=GID] SCRIPT``: prints
    ``<job id>[;<cluster>]``. ``sbatch``: the command's absolute path; ``export_fd``: the open
    descriptor holding the job's own variables (``export_file_content``), a placeholder in a dry
    run; ``run_as``: the Unix user the job runs as on every node, with its primary group
    (``--uid``/``--gid``: only root may submit for another user)."""
    who = [f"--uid={run_as.user}", f"--gid={run_as.gid}"] if run_as is not None else []
    return [sbatch, "--parsable", f"--export-file={export_fd}", *who, str(script_path)]


def _kept(server_env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in server_env.items() if k in KEPT_ENV or k.startswith(KEPT_PREFIXES)}


def job_environment(
    server_env: Mapping[str, str], job_env: Mapping[str, str], run_as: RunAs | None = None,
) -> dict[str, str]:
    """The job's environment as its export file states it (``export_file_content``): the few
    variables of ``KEPT_ENV`` from the server (a ``run_as`` job: its user's ``HOME``, ``USER``
    and ``LOGNAME`` instead of the server's), then the job's own. Slurm adds its ``SLURM_*``;
    nothing else of the server's environment (its API tokens, database URL, cloud credentials)
    reaches a rank (``sbatch --export-file`` replaces sbatch's own environment in the job's)."""
    login = run_as.login_env() if run_as is not None else {}
    return {**_kept(server_env), **login, **job_env}


def sbatch_environment(server_env: Mapping[str, str]) -> dict[str, str]:
    """The environment ``sbatch`` itself runs with: the same few variables of the server's own
    environment (enough to find the Slurm configuration). Nothing of the job's is ever here,
    where it could choose sbatch's options (``SBATCH_*``) or the programs it runs (``PATH``);
    the job's environment is its export file's (``job_environment``)."""
    return _kept(server_env)


def export_file_content(job_env: Mapping[str, str]) -> bytes:
    """The job's own variables as ``sbatch --export-file`` reads them: ``NAME=value`` entries
    separated by NUL bytes (values may hold newlines; names and values never hold NUL)."""
    for name, value in job_env.items():
        if "\0" in name or "\0" in value or "=" in name or not name:
            raise ValueError(f"environment variable {name!r}: not exportable")
    return b"\0".join(f"{name}={value}".encode() for name, value in job_env.items())
