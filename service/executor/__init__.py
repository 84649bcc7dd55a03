"""Executors: how a job's processes are started, watched, adopted, cancelled and found
(see :mod:`service.executor.base`). ``make_executor`` builds the configured one."""

from typing import TYPE_CHECKING

from service.executor.base import Executor

if TYPE_CHECKING:
    from service.executor.slurm import SlurmExecutor
    from service.executor.warmpool import WarmPool
    from service.settings import Settings

# Importing this package must stay cheap: the per-job attempt loop imports service.run.proctree on
# every job's start path, so the executors (and pydantic settings) load only in make_executor.


def make_executor(settings: "Settings", warm: "WarmPool | None" = None) -> Executor:
    """The executor ``settings.executor`` names (``TORCHYARD_EXECUTOR``)."""
    from service.executor.local import LocalExecutor

    if settings.executor == "local":
        # The attempt loop runs on the server's python; its torchrun (and a run-as job's
        # attempt loop, started as the team's user) on settings'.
        return LocalExecutor(warm=warm, spare_loop=True, user_python=settings.python_executable)
    if settings.executor == "slurm":
        return make_slurm_executor(settings)
    raise ValueError(f"executor: {settings.executor!r} is not one of: local, slurm")


def make_slurm_executor(settings: "Settings") -> "SlurmExecutor":
    """Slurm's commands run by the absolute paths found now on the server's own ``PATH`` (or in
    ``TORCHYARD_SLURM_BIN_DIR``), with the server's environment less its secrets; ``sbatch``
    gets far less (``slurmscript.sbatch_environment``), and never a job's variables."""
    import os
    import sys

    from service.executor.slurm import SlurmDefaults, SlurmExecutor
    from service.executor.slurmcli import SlurmCli
    from torchyard_contract.childenv import environ_for_children

    cli = SlurmCli(
        env=environ_for_children(os.environ),
        bin_dir=str(settings.slurm_bin_dir) if settings.slurm_bin_dir else None,
        timeout_s=settings.slurm_command_timeout_s,
    )
    return SlurmExecutor(
        cli,
        # The attempt loop and torchrun run on the nodes with this interpreter: the same path there.
        python=settings.python_executable or sys.executable,
        server_env=os.environ,
        stop_grace_s=settings.stop_grace_s,
        defaults=SlurmDefaults(
            partition=settings.slurm_partition, account=settings.slurm_account,
            qos=settings.slurm_qos, constraint=settings.slurm_constraint,
        ),
        shared_runs=settings.slurm_shared_runs,
    )
