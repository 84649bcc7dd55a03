"""One attempt of a Slurm job as a job step: the ``srun`` argv the attempt loop runs on the batch
host. Pure: nothing here starts a process (``service.executor.slurmscript`` builds the rest of
what the Slurm executor runs, and shows this in a dry run).
"""

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from service.run import fastexit

# One torchrun per node: writes the node's name (``RunDir.node_name_file``: the server shows it
# with a rank's log, and ``retry_elsewhere`` excludes it), then execs torchrun with this node's
# rank and log directory (through service.run.fastexit: the agent ends without tearing torch
# down, as on the local executor). Positional: $1 = the attempt's log dir, $2 = python, the
# rest = torchrun's other options and the rank program. A constant: no job's value is spliced in.
NODE_WRAPPER = (
    'd="$1/node-$SLURM_NODEID"; py="$2"; shift 2; mkdir -p "$d" && '
    'printf "%s\\n" "$SLURMD_NODENAME" > "$d/node" && '
    f'exec "$py" {" ".join(fastexit.PREFIX)} -m torch.distributed.run '
    '--node-rank="$SLURM_NODEID" --log-dir="$d" "$@"'
)


@dataclass(frozen=True)
class StepRequest:
    """One attempt as a job step (built by the attempt loop on the batch host)."""

    python: str
    nnodes: int
    nproc_per_node: int
    master_addr: str
    master_port: int
    logs_dir: Path  # logs/attempt-<n>
    program: Sequence[str]
    gpus_per_node: int = 0


def build_srun_command(req: StepRequest) -> list[str]:
    """``srun`` starting one torchrun per node; pure, an argv list (no shell string built from
    values: the node wrapper is a constant and every value is a positional argument)."""
    cpus = req.gpus_per_node or req.nproc_per_node
    srun = [
        "srun",
        "--kill-on-bad-exit=1",  # one node's torchrun failing stops the others: the attempt ends
        f"--nodes={req.nnodes}",
        f"--ntasks={req.nnodes}",
        "--ntasks-per-node=1",
        f"--cpus-per-task={cpus}",
        f"--output={req.logs_dir}/node-%n.log",
        "--export=ALL",
    ]
    if req.gpus_per_node:
        srun.append(f"--gpus-per-node={req.gpus_per_node}")
    torchrun_opts = [
        f"--nnodes={req.nnodes}",
        f"--nproc-per-node={req.nproc_per_node}",
        f"--master-addr={req.master_addr}",
        f"--master-port={req.master_port}",
        "--max-restarts=0",
        "--redirects=3",
        "--tee=3",
        "--monitor-interval=0.1",
    ]
    return [
        *srun, "sh", "-c", NODE_WRAPPER, "sh", str(req.logs_dir), req.python,
        *torchrun_opts, *req.program,
    ]
