"""Where a Slurm job's ranks ran, and the names of nodes a job leaves out.

Part of the contract: the attempt loop (``service.run.elsewhere``) finds the node a failing rank
ran on, to restart the job without it (``retry_elsewhere``, docs/lifecycle.md); the server
shows the same node in ``GET /jobs/<id>/logs`` (``service.executor.slurm``) and hands the nodes a
job excludes to ``sbatch --exclude``.

Layout: under the static rendezvous, global rank ``r`` runs on node ``r // nproc_per_node`` of
the allocation (node-major, ``rank_location``), and that node's torchrun wrapper writes the
node's name (``$SLURMD_NODENAME``) to ``logs/attempt-<n>/node-<k>/node``
(``RunDir.node_name_file``) before it starts. The job's processes can write there too, so a name
read back is only used when it is a plain node name (``NODE_NAME_PATTERN``).
"""

import re
from typing import Annotated

from pydantic import StringConstraints

from torchyard_contract.rundir import RunDir
from torchyard_contract.safefile import read_bytes

# A node's name as ``--exclude`` takes it: a host name's characters, one node (no hostlist
# brackets, commas or spaces: nothing an #SBATCH line or a shell could read as syntax).
NODE_NAME_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$"
NodeName = Annotated[str, StringConstraints(pattern=NODE_NAME_PATTERN)]
# Nodes one job may exclude, all its restarts elsewhere together; one more fails the job.
EXCLUDE_NODES_MAX = 128
NODE_FILE_MAX_BYTES = 256


def rank_location(rank: int, nproc_per_node: int) -> tuple[int, int]:
    """(node index, local rank) of a global rank under static rendezvous (node-major)."""
    return divmod(int(rank), max(1, int(nproc_per_node)))


def global_rank(node_index: int, local_rank: int, nproc_per_node: int) -> int:
    """The global rank of ``local_rank`` on node ``node_index`` (``rank_location``'s inverse)."""
    return int(node_index) * max(1, int(nproc_per_node)) + int(local_rank)


def is_node_name(text: str) -> bool:
    return re.fullmatch(NODE_NAME_PATTERN, text) is not None


def read_node_name(run: RunDir, attempt: int, node_index: int) -> str | None:
    """What node ``node_index`` of ``attempt`` wrote as its name (stripped; invalid UTF-8
    replaced), or None when there is no such regular file of at most ``NODE_FILE_MAX_BYTES``.
    Not validated: check ``is_node_name`` before using it as one."""
    raw = read_bytes(run.node_name_file(attempt, node_index), NODE_FILE_MAX_BYTES)
    if raw is None:
        return None
    return raw.decode(errors="replace").strip() or None
