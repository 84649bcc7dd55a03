"""``retry_elsewhere`` on Slurm: the node the failing rank ran on, which the job's next allocation
leaves out (docs/lifecycle.md, "Retry rules").

Inside its allocation a job step cannot leave a node out without shrinking the job, so the
attempt loop (``service.run.attemptloop``) ends the batch job with the outcome ``requeue`` naming
the node, and the server submits the job again with ``--exclude``. This module only finds the
node: the failing rank's node index (``torchyard_contract.nodes.rank_location``) and the name
that node's torchrun wrapper wrote (``RunDir.node_name_file``). A name that is missing or not a
plain node name (the job's own processes can write there) is no node: the attempt is then
retried in place, saying why.
"""

from dataclasses import dataclass

from torchyard_contract.launch import LaunchConfig
from torchyard_contract.nodes import is_node_name, rank_location, read_node_name
from torchyard_contract.rundir import RunDir


@dataclass(frozen=True)
class FailingNode:
    name: str | None  # the node to exclude; None = not found (``why``)
    why: str = ""


def failing_node(run: RunDir, config: LaunchConfig, attempt: int, rank: int | None) -> FailingNode:
    """The node ``rank`` of ``attempt`` ran on, by the name its node wrote."""
    if rank is None or not 0 <= rank < config.world_size:
        return FailingNode(None, "no failing rank is known")
    node_index, _ = rank_location(rank, config.nproc_per_node)
    name = read_node_name(run, attempt, node_index)
    if name is None:
        return FailingNode(None, f"node {node_index} of the attempt left no readable name "
                           f"({run.node_name_file(attempt, node_index)})")
    if not is_node_name(name):
        return FailingNode(None, f"node {node_index} of the attempt wrote {name[:80]!r}, not a "
                           "node name")
    return FailingNode(name)
