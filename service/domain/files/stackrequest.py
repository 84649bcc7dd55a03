"""Ranks' stacks for the API: asked of a running job's shim, or the ones kept at a hang.

The shim takes them (``service.run.stacks``); the server only writes a request into the run
directory (``stacks/requests/<nonce>``, a random name) and reads the answer
(``stacks/<nonce>.json``) the shim writes within its next poll — on every executor whose shim
shares the run directory with the server (the local one; Slurm's on the shared filesystem).
What is read was written in a directory the job can write too: regular files only, bounded,
validated by the route's response model.
"""

import json
import secrets
import time

from torchyard_contract import runwrite
from torchyard_contract.rundir import RunDir
from torchyard_contract.safefile import read_bytes

STACKS_WAIT_S = 15.0  # the shim polls every 0.2 s; py-spy takes tens of ms per rank
STACKS_POLL_S = 0.05
STACKS_FILE_MAX_BYTES = 8 * 1024 * 1024


class StacksTimeout(Exception):
    """The job's shim did not answer in time."""


def _read(path) -> dict | None:  # type: ignore[no-untyped-def]
    raw = read_bytes(path, STACKS_FILE_MAX_BYTES)
    if raw is None:
        return None
    try:
        data = json.loads(raw)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def take_now(run: RunDir, wait_s: float = STACKS_WAIT_S) -> dict:
    """Ask the job's shim for every rank's stacks and wait for its answer."""
    nonce = secrets.token_hex(16)
    requests = run.stacks_dir / "requests"
    runwrite.make_dir(requests)  # confined: the run directory may be the job's user's
    answer = run.stacks_dir / f"{nonce}.json"
    runwrite.write_file(requests / nonce, b"")
    deadline = time.monotonic() + wait_s
    try:
        while time.monotonic() < deadline:
            data = _read(answer)
            if data is not None:
                return data
            time.sleep(STACKS_POLL_S)
        raise StacksTimeout(f"the job's shim did not answer within {wait_s:g} s")
    finally:
        runwrite.remove(requests / nonce)
        runwrite.remove(answer)


def at_hang(run: RunDir, attempt: int) -> dict | None:
    """The stacks the shim took when attempt ``attempt``'s heartbeat timed out; None if none."""
    return _read(run.stacks_dir / f"attempt-{int(attempt)}.json")
