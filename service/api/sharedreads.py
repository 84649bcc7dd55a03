"""One database read, shared by every event stream of a job that wants the same thing.

A commit wakes every stream of its job at once (``service.changefeed``); the streams that were
caught up then all want the same read: the job and its records after the same ``seq``, as of
the same change version. The first one starts it on the thread pool; the others await that
read instead of making their own (100 streams of one job: one read per commit, not 100;
docs/benchmarks.md, "Stores and workers"). A read is shared only while it is in flight, so a
result is never older than the change version it was started at.
"""

import asyncio
from collections.abc import Callable, Hashable
from typing import Any

from starlette.concurrency import run_in_threadpool


class SharedReads:
    """Per process and event loop (``app.state``): reads in flight, by key."""

    def __init__(self) -> None:
        self._in_flight: dict[Hashable, asyncio.Future[Any]] = {}

    async def read(self, key: Hashable, func: Callable[..., Any], *args: Any) -> Any:
        """``func(*args)`` on the thread pool, or the result of the call already running under
        ``key``. The key must name everything the result depends on."""
        future = self._in_flight.get(key)
        if future is None:
            future = asyncio.ensure_future(run_in_threadpool(func, *args))
            self._in_flight[key] = future
            future.add_done_callback(lambda done: self._done(key, done))
        # A stream that goes away (client closed) must not cancel the read the others await.
        return await asyncio.shield(future)

    def _done(self, key: Hashable, future: asyncio.Future[Any]) -> None:
        if self._in_flight.get(key) is future:
            del self._in_flight[key]
        if not future.cancelled():
            future.exception()  # retrieved here, so one nobody awaited any more is not logged
