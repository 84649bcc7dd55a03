"""The claim on a launched job's run directory: closes the window between starting a job's attempt loop
and storing its reference.

The supervisor commits ``starting``, has the executor start the attempt loop, then stores the reference
the executor returned. A server killed in between leaves a ``starting`` job with no reference
while its attempt loop may be running. So exactly one party claims ``RUN_DIR/claim.json``, once:

* the attempt loop, first thing, before it runs anything: it records its pid, start time (``create_time``
  and ``start_ticks``, ticks since boot) and host, and
  runs the job;
* or the recovery of a later server that finds a launched job without a reference and no claim:
  the launch is given up (the job fails), and an attempt loop that starts after that exits at once
  without running anything.

A recovery that finds the attempt loop's claim adopts the attempt loop from it (``Executor.reference_from_claim``).
The claim is created atomically with its content (a complete temp file hard-linked into place),
so a reader never sees half of one and two claimants never both win.
"""

import json
import os
import uuid
from typing import Any

from torchyard_contract.rundir import RunDir
from torchyard_contract.safefile import read_json_object

ABANDONED = "abandoned_by"
CLAIM_MAX_BYTES = 64 * 1024  # a claim is a few fields; the job can write where it lies


def claim(run: RunDir, content: dict[str, Any]) -> dict[str, Any] | None:
    """Claim the run with ``content``; None if this call won, else the claim that was there."""
    run.root.mkdir(parents=True, exist_ok=True)
    tmp = run.root / f".claim-{uuid.uuid4().hex}"
    tmp.write_text(json.dumps(content))
    try:
        os.link(tmp, run.claim_file)
        return None
    except FileExistsError:
        return read_claim(run) or {}
    finally:
        tmp.unlink(missing_ok=True)


def read_claim(run: RunDir) -> dict[str, Any] | None:
    """The claim, read as every file a job can write is (``torchyard_contract.safefile``);
    None when there is none, or it is not a regular file, too large, or not a JSON object."""
    return read_json_object(run.claim_file, CLAIM_MAX_BYTES)


def is_abandoned(content: dict[str, Any]) -> bool:
    return ABANDONED in content
