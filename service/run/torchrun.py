"""One attempt's torchrun on this host: a pure command builder.

``build_command`` is pure (printable as a dry run, unit-testable); the local launcher
(``service.run.launcher.LocalLauncher``) runs it for the job's attempt loop; starting the job
itself is an executor's (``service.executor``).
"""

from dataclasses import dataclass, field
from pathlib import Path

from service.run import fastexit


@dataclass(frozen=True)
class LaunchRequest:
    """Everything needed to start one attempt's torchrun; built by the local launcher."""

    job_id: int
    python: str
    nproc_per_node: int
    master_port: int
    run_dir: Path
    logs_dir: Path
    program: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    # Warm ranks (``service.run.warm``): (relay program, warm server socket); None = cold.
    relay: tuple[str, str] | None = None
    cwd: Path | None = None  # where torchrun and the ranks start; None = run_dir


def build_command(req: LaunchRequest) -> list[str]:
    """The torchrun argv for a single-node group with static rendezvous on a free port.

    ``req.program`` is what each rank runs, after torchrun's options: ``("-m", "worker",
    "--spec", SPEC)`` for the built-in trainer, ``(SCRIPT, *args)`` or ``("-m", MODULE, *args)``
    for a script job (see ``service.domain.intake.scriptpath``). An argv list, never a shell string.

    With ``req.relay`` torchrun's agent runs through the relay (``python RELAY SOCKET <python
    args>``), which becomes a process of the warm server: the same torchrun options, started
    without importing torch again. The rank program carries its own relay where it wants one
    (the attempt loop puts it behind ``service.run.ranktee``, so the warm process is the job's program
    itself and the tee a plain, stdlib-only process in front of it).
    """
    # Cold, the agent ends without tearing torch down (service.run.fastexit); warm, the warm
    # process ends that way.
    start = list(req.relay) if req.relay is not None else list(fastexit.PREFIX)
    return [
        req.python,
        *start,
        "-m",
        "torch.distributed.run",
        "--nnodes=1",
        f"--nproc-per-node={req.nproc_per_node}",
        "--master-addr=127.0.0.1",
        f"--master-port={req.master_port}",
        "--max-restarts=0",
        f"--log-dir={req.logs_dir}",
        "--redirects=3",
        "--tee=3",
        "--monitor-interval=0.1",  # torchrun's default: notices a rank exit as plain torchrun does
        *req.program,
    ]
