"""How many ranks a job has and how many attempts it may make: one rule for the server and the
attempt loop.

**World size.** ``nnodes × nproc_per_node`` ranks; global rank ``r`` runs on node
``r // nproc_per_node`` (``torchyard_contract.nodes``). The server reads it from a stored spec
(:func:`spec_world_size`), the attempt loop from its launch configuration
(``LaunchConfig.world_size``); both call :func:`world_size`.

**The restart budget** (docs/fault-tolerance.md). A job may fail ``max_restarts + 1`` attempts;
the failure that uses the last of them ends it. An attempt a pause ended (its record says
``paused``) is no failure and uses no restart, so a job's run directory holds at most
``max_restarts + 1`` attempts plus one per pause (:attr:`AttemptBudget.attempts_max`). The two
sides count pauses where they see them: the attempt loop counts the paused attempts its run
directory holds, the server the job's pauses (``jobs.pauses``: at least as many, since a pause
asked between two attempts ends a launch without one).

Pure and cheap to import: the attempt loop imports it at start.
"""

from collections.abc import Mapping
from dataclasses import dataclass


def world_size(nnodes: int, nproc_per_node: int) -> int:
    """The job's ranks: ``nproc_per_node`` on each of ``nnodes`` nodes."""
    return nnodes * nproc_per_node


def spec_world_size(spec: Mapping | None) -> int:
    """The ranks of a stored spec (a JSON object: ``nnodes`` absent means 1); at least 1, also
    for a spec whose numbers are not numbers (stored before validation was as strict)."""
    spec = spec or {}
    try:
        return world_size(max(1, int(spec.get("nnodes", 1) or 1)),
                          max(1, int(spec.get("nproc_per_node", 1))))
    except (TypeError, ValueError):
        return 1


@dataclass(frozen=True)
class AttemptBudget:
    """A job's restart budget. ``pauses``: the attempts a pause ended (the attempt loop), or the
    times the job was paused (the server), never negative."""

    max_restarts: int
    pauses: int = 0

    @classmethod
    def of_spec(cls, spec: Mapping | None, pauses: int = 0) -> "AttemptBudget":
        """The budget of a stored spec (``max_restarts`` absent or not a number: 0)."""
        try:
            max_restarts = max(0, int((spec or {}).get("max_restarts", 0) or 0))
        except (TypeError, ValueError):
            max_restarts = 0
        return cls(max_restarts, max(0, pauses))

    @property
    def attempts_max(self) -> int:
        """The most attempts the job's run directory may hold."""
        return self.max_restarts + 1 + max(0, self.pauses)

    def failures(self, number: int) -> int:
        """The failed attempts once attempt ``number`` (1-based, the job's numbering across
        launches) has failed: those a pause ended are not counted."""
        return number - max(0, self.pauses)

    def allows_restart(self, failures: int) -> bool:
        """Another attempt may follow ``failures`` failed ones (a rule that says ``fail`` ends
        the job whatever is left)."""
        return failures <= self.max_restarts
