"""The hot reads (metrics polls, event streams): bounded on the thread pool, shared where equal.

**Bounded.** At most ``HOT_READS`` of them run at once per process; more wait on the event loop,
where waiting costs nothing. With no bound, a burst of polls ran on up to 40 threads, so the
read engine opened connections beyond the ones its pool keeps and closed them again (on
PostgreSQL a new server process each: stalls of 0.1–0.2 s), and the threads fought over the
GIL. The bound stays below the connections the read pool keeps (``service.store.db``).

**Shared.** A commit wakes every stream of its job at once (``service.store.changefeed``); the streams
that were caught up then all want the same read: the job and its records after the same
``seq``, as of the same change version. The first one starts it; the others await that read
instead of making their own (100 streams of one job: one read per commit, not 100;
docs/benchmarks.md, "Stores and API processes"). A read is shared only while it is in flight, so a
result is never older than the change version it was started at.
"""

import asyncio
from collections.abc import Callable, Hashable
from typing import Any

import anyio.to_thread

from service.store.db import SERVER_POOL_SIZE

# Below the connections a PostgreSQL read pool keeps, leaving a few for the other GET routes.
HOT_READS = SERVER_POOL_SIZE - 2


class HotReads:
    """Per process and event loop (``app.state.hot_reads``)."""

    def __init__(self, limit: int = HOT_READS) -> None:
        self._limiter = anyio.CapacityLimiter(limit)
        self._in_flight: dict[Hashable, asyncio.Future[Any]] = {}

    async def run(self, func: Callable[..., Any], *args: Any) -> Any:
        """``func(*args)`` on the thread pool, once a slot is free."""
        return await anyio.to_thread.run_sync(func, *args, limiter=self._limiter)

    async def shared(self, key: Hashable, func: Callable[..., Any], *args: Any) -> Any:
        """``run(func, *args)``, or the result of the call already running under ``key``. The
        key must name everything the result depends on."""
        future = self._in_flight.get(key)
        if future is None:
            future = asyncio.ensure_future(self.run(func, *args))
            self._in_flight[key] = future
            future.add_done_callback(lambda done: self._done(key, done))
        # A stream that goes away (client closed) must not cancel the read the others await.
        return await asyncio.shield(future)

    def _done(self, key: Hashable, future: asyncio.Future[Any]) -> None:
        if self._in_flight.get(key) is future:
            del self._in_flight[key]
        if not future.cancelled():
            future.exception()  # retrieved here, so one nobody awaited any more is not logged
