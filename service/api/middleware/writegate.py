"""Write requests on the thread pool, bounded per process, so a lock held elsewhere cannot take
every thread.

A write waits for its database lock at most ``TORCHYARD_DB_LOCK_TIMEOUT_S`` (``service.store.db``), on
one of Starlette's 40 threads. Unbounded, a burst of record posts for a job whose lock a paused
process held took all of them, and ``/healthz`` and every read of that process stopped answering
until the pause ended. So at most ``WRITE_SLOTS`` write requests per process run at once; the
others wait on the event loop, where waiting costs nothing, for at most the lock timeout, and
are then answered 503 with ``Retry-After``, as a write whose lock wait ran out is. Without a
lock held elsewhere a slot is free within a few milliseconds: SQLite runs one writer at a time
per process anyway, and the bound stays below the writer connections a PostgreSQL pool keeps.

The routes that write take a slot (``WriteSlotDep``) after their body is read, so a slow upload
holds none. Record posts take theirs from slots of their own (``app.state.record_gate``, taken
in the route itself: a dependency with ``yield`` costs more than the gate): a burst of
batches for a job whose record lock a frozen process holds (PostgreSQL) waits there without
taking the slots a submit or a cancel needs, which take none of that lock.
"""

from collections.abc import AsyncIterator
from typing import Annotated

import anyio
from fastapi import Depends, Request

from service.api.errors import unavailable
from service.store.db import SERVER_POOL_SIZE

WRITE_SLOTS = SERVER_POOL_SIZE - 2  # in all: record posts' and the other writes'
RECORD_SLOTS = WRITE_SLOTS // 2


class WriteGate:
    """Per process and event loop (``app.state.write_gate``; ``record_gate`` for record posts)."""

    def __init__(self, wait_s: float, slots: int = WRITE_SLOTS - RECORD_SLOTS) -> None:
        self.wait_s, self.slots = wait_s, slots
        self._slots = anyio.Semaphore(slots)

    async def acquire(self) -> None:
        """A slot, or 503 once none was free for ``wait_s``."""
        try:
            self._slots.acquire_nowait()  # the common case, without a cancel scope
            return
        except anyio.WouldBlock:
            pass
        with anyio.move_on_after(self.wait_s):
            await self._slots.acquire()
            return
        raise unavailable(self.wait_s, f"no write slot came free in {self.wait_s:g} s (this "
                          f"process runs {self.slots} such writes at once; the database is "
                          "busy)")

    def release(self) -> None:
        self._slots.release()


async def write_slot(request: Request) -> AsyncIterator[None]:
    gate: WriteGate = request.app.state.write_gate
    await gate.acquire()
    try:
        yield
    finally:
        gate.release()


WriteSlotDep = Annotated[None, Depends(write_slot)]
