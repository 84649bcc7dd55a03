"""Which processes are a running attempt's rank programs, on this host.

A rank program is the child of its ``service.run.ranktee`` (whose ``--run-dir`` names the run),
with ``RANK`` in its environment. Cold ranks are found below the job's attempt loop; warm ranks
(``service.run.warm``) are processes of the warm server instead, which names them (its
``status``: pid, job and rank of each); on a Slurm node they live under ``slurmstepd`` and are
found among all the node's processes. Used to take their stacks (``service.run.stackdump``) and
to tell them of a pause (``service.run.pausesignal``).
"""

import os

import psutil

from service.run.warm import relay
from torchyard_contract.launch import LaunchConfig
from torchyard_contract.rundir import RunDir


def rank_processes(
    run: RunDir, config: LaunchConfig, warm_socket: str | None = None
) -> dict[int, psutil.Process]:
    """rank → process of this attempt's rank programs, as the attempt loop sees them: warm ones through
    the warm server at ``warm_socket``, else below this process."""
    if warm_socket:
        return _warm(warm_socket, config.job_id, config.world_size)
    return _below_or_anywhere(run, config.world_size, False)


def node_rank_processes(run: RunDir, world_size: int) -> dict[int, psutil.Process]:
    """rank → process of the run's rank programs anywhere on this host (a Slurm node)."""
    return _below_or_anywhere(run, world_size, True)


def _below_or_anywhere(run: RunDir, world_size: int, anywhere: bool) -> dict[int, psutil.Process]:
    """This run's rank programs on this host: below this process, or (``anywhere``: a node of a
    Slurm job, where ranks live under ``slurmstepd``) any process whose ranktee names the run."""
    ranks: dict[int, psutil.Process] = {}
    try:
        candidates = (list(psutil.process_iter()) if anywhere
                      else psutil.Process(os.getpid()).children(recursive=True))
    except psutil.Error:
        return ranks
    for proc in candidates:
        try:
            parent = proc.parent()
            if parent is None or is_ranktee(proc.cmdline()):
                continue
            tee = parent.cmdline()
            if not is_ranktee(tee) or _arg(tee, "--run-dir") != str(run.root):
                continue
            rank = int(proc.environ().get("RANK", "-1"))
        except (psutil.Error, ValueError):
            continue
        if 0 <= rank < world_size:
            ranks.setdefault(rank, proc)
    return ranks


def _warm(
    warm_socket: str, job_id: int, world_size: int
) -> dict[int, psutil.Process]:
    """This job's warm rank programs, as the warm server at ``warm_socket`` names them (its
    relays below the attempt loop are not the programs); empty when it does not answer."""
    status = relay.ask(warm_socket, {"op": "status"}) or {}
    ranks: dict[int, psutil.Process] = {}
    for entry in status.get("ranks") or []:
        try:
            if entry.get("job_id") != str(job_id) or entry.get("rank") is None:
                continue  # another job's, or torchrun's agent (no RANK)
            rank = int(entry["rank"])
            if 0 <= rank < world_size:
                ranks.setdefault(rank, psutil.Process(int(entry["pid"])))
        except (psutil.Error, ValueError, TypeError, AttributeError):
            continue
    return ranks


def _arg(cmdline: list[str], name: str) -> str | None:
    return next((cmdline[i + 1] for i, a in enumerate(cmdline[:-1]) if a == name), None)


def is_ranktee(cmdline: list[str]) -> bool:
    """``python [-u] -m service.run.ranktee …`` (torchrun's own command line names it later,
    after its first ``-m``)."""
    first = next((i for i, arg in enumerate(cmdline[:8]) if arg == "-m"), None)
    return first is not None and cmdline[first + 1:first + 2] == ["service.run.ranktee"]
