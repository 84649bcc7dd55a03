"""Ranks' stacks for the API: asked of a running job's attempt loop, or the ones kept at a hang.

The attempt loop takes them (``service.run.stackdump``); the server only writes a request into the run
directory (``stacks/requests/<nonce>``, a random name) and reads the answer
(``stacks/<nonce>.json``) the attempt loop writes within its next poll — on every executor whose attempt loop
shares the run directory with the server (the local one; Slurm's on the shared filesystem).
What is read was written in a directory the job can write too: regular files only, bounded,
validated by the route's response model.

The attempt loop is a process the job controls (a job can stop it: its pid is in the claim file), so
:func:`take_now` waits for its answer only until a deadline, and holds no thread meanwhile: it is
awaited on the event loop, each look at the files a short hop to the thread pool. How many calls
may wait at once is the API's bound (``service.api.stacksgate``).
"""

import secrets
import time
from collections.abc import Callable
from pathlib import Path

import anyio
import anyio.to_thread

from torchyard_contract import runwrite
from torchyard_contract.rundir import RunDir
from torchyard_contract.safefile import read_json_object

STACKS_WAIT_S = 15.0  # the attempt loop polls every 0.2 s; py-spy takes tens of ms per rank
STACKS_POLL_S = 0.1
STACKS_FILE_MAX_BYTES = 8 * 1024 * 1024


class StacksTimeout(Exception):
    """The job's attempt loop did not answer in time."""


def _read(path: Path) -> dict | None:
    return read_json_object(path, STACKS_FILE_MAX_BYTES)


class _Request:
    """One request file (``stacks/requests/<nonce>``) and where its answer will be."""

    def __init__(self, run: RunDir) -> None:
        nonce = secrets.token_hex(16)
        self.requests = run.stacks_dir / "requests"
        self.request = self.requests / nonce
        self.answer_file = run.stacks_dir / f"{nonce}.json"

    def send(self) -> None:
        runwrite.make_dir(self.requests)  # confined: the run directory may be the job's user's
        runwrite.write_file(self.request, b"")

    def answer(self) -> dict | None:
        return _read(self.answer_file)

    def withdraw(self) -> None:
        runwrite.remove(self.request)
        runwrite.remove(self.answer_file)


async def take_now(
    run: RunDir, wait_s: float = STACKS_WAIT_S, stop: Callable[[], bool] = lambda: False,
) -> dict:
    """Ask the job's attempt loop for every rank's stacks and await its answer: ``StacksTimeout`` when
    none came within ``wait_s`` (or once ``stop()``: the server is shutting down). Awaited on
    the event loop; the files are looked at on the thread pool, one short hop each poll."""
    request = _Request(run)
    deadline = time.monotonic() + wait_s
    try:
        await anyio.to_thread.run_sync(request.send)
        while True:
            data = await anyio.to_thread.run_sync(request.answer)
            if data is not None:
                return data
            left = deadline - time.monotonic()
            if left <= 0:
                raise StacksTimeout(f"the job's attempt loop did not answer within {wait_s:g} s")
            if stop():
                raise StacksTimeout("the server is shutting down")
            await anyio.sleep(min(STACKS_POLL_S, left))
    finally:
        with anyio.CancelScope(shield=True):  # a cancelled call withdraws its request too
            await anyio.to_thread.run_sync(request.withdraw)


def at_hang(run: RunDir, attempt: int) -> dict | None:
    """The stacks the attempt loop took when attempt ``attempt``'s heartbeat timed out; None if none."""
    return _read(run.stacks_dir / f"attempt-{int(attempt)}.json")
