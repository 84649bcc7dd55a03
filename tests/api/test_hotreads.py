"""``service.api.hotreads``: equal reads in flight are made once, and never more than the bound run
at once (real threads, real event loop)."""

import asyncio
import threading
import time
from collections.abc import Callable

import pytest

from service.api.hotreads import HotReads


class Counting:
    """A read that counts its calls and its peak concurrency, and, when ``held``, runs until the
    test lets it end (``release``): the test decides what overlaps, not a sleep's length."""

    def __init__(self, held: bool = False) -> None:
        self.calls = 0
        self.running = 0
        self.peak = 0
        self._lock = threading.Lock()
        self._go = threading.Semaphore(0)
        self._held = held

    def __call__(self, value: object) -> object:
        with self._lock:
            self.calls += 1
            self.running += 1
            self.peak = max(self.peak, self.running)
        if self._held:
            assert self._go.acquire(timeout=30), "never released"
        with self._lock:
            self.running -= 1
        if isinstance(value, Exception):
            raise value
        return value

    def release(self, count: int = 1) -> None:
        self._go.release(count)


async def until(condition: Callable[[], bool], timeout_s: float = 30) -> None:
    """Until ``condition()`` holds, yielding to the event loop in between (so every task made
    before this call has run up to its first wait by the time it returns)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        await asyncio.sleep(0.005)


def test_streams_woken_together_share_one_read_per_key() -> None:
    read = Counting(held=True)

    async def main() -> list[object]:
        reads = HotReads()
        same = [asyncio.ensure_future(reads.shared(("job", 1, 5), read, "a")) for _ in range(100)]
        other = [asyncio.ensure_future(reads.shared(("job", 1, 6), read, "b")) for _ in range(3)]
        await until(lambda: read.running == 2)  # both reads in flight, every caller waiting
        read.release(2)
        return await asyncio.gather(*same, *other)

    results = asyncio.run(main())
    assert results == ["a"] * 100 + ["b"] * 3
    assert read.calls == 2


def test_a_read_is_shared_only_while_in_flight() -> None:
    read = Counting()

    async def main() -> None:
        reads = HotReads()
        for _ in range(3):
            await reads.shared("key", read, 1)

    asyncio.run(main())
    assert read.calls == 3  # a finished read is never handed to a later caller


def test_one_caller_going_away_does_not_cancel_the_read_the_others_await() -> None:
    read = Counting(held=True)

    async def main() -> tuple[object, bool]:
        reads = HotReads()
        leaving = asyncio.ensure_future(reads.shared("key", read, "x"))
        staying = asyncio.ensure_future(reads.shared("key", read, "x"))
        await until(lambda: read.running == 1)  # the one read in flight, both callers on it
        leaving.cancel()
        await until(leaving.done)
        read.release()
        return await staying, leaving.cancelled()

    assert asyncio.run(main()) == ("x", True)
    assert read.calls == 1


def test_an_error_reaches_every_caller_of_the_shared_read() -> None:
    read = Counting()

    async def main() -> list[object]:
        reads = HotReads()
        boom = RuntimeError("database gone")
        return await asyncio.gather(*(reads.shared("key", read, boom) for _ in range(5)),
                                    return_exceptions=True)

    errors = asyncio.run(main())
    assert [str(e) for e in errors] == ["database gone"] * 5
    assert read.calls == 1


@pytest.mark.parametrize("limit", [1, 3])
def test_no_more_reads_run_at_once_than_the_bound(limit: int) -> None:
    """Reads end only when released, one at a time, each once ``limit`` of them run: without
    the bound every read would be running by then, as none can end before it is let go."""
    read = Counting(held=True)

    def all_the_bound_allows(left: int) -> bool:
        assert read.peak <= limit, f"{read.peak} reads at once, the bound is {limit}"
        return read.running == min(limit, left)

    async def main() -> None:
        reads = HotReads(limit)
        tasks = [asyncio.ensure_future(reads.run(read, i)) for i in range(20)]
        for left in range(20, 0, -1):
            await until(lambda left=left: all_the_bound_allows(left))  # type: ignore[misc]
            read.release()
        await asyncio.gather(*tasks)

    asyncio.run(main())
    assert read.calls == 20
    assert read.peak == limit


def test_a_page_written_without_models_is_the_page_the_models_write() -> None:
    # The hot reads serialize plain dicts (recordschemas.metric_item) instead of a MetricRead per
    # record: the bytes must be those of MetricsPage, for every kind of record.
    from types import SimpleNamespace

    from pydantic_core import to_json

    from service.api.recordschemas import MetricRead, MetricsPage, metric_item
    from service.store.records import EPOCH_STEP

    rows = [
        SimpleNamespace(seq=1, attempt=1, rank=0, epoch=3, step=EPOCH_STEP, name="loss",
                        value=0.25, nonfinite=None, time=1.5),
        SimpleNamespace(seq=2, attempt=2, rank=7, epoch=0, step=2**62, name="a.b:c/d-e_f",
                        value=-1e300, nonfinite=None, time=1796000000.123456),
        SimpleNamespace(seq=3, attempt=1, rank=1, epoch=1, step=5, name="x", value=None,
                        nonfinite="-Infinity", time=0.0),
        SimpleNamespace(seq=4, attempt=1, rank=1, epoch=1, step=6, name="y", value=3.0,
                        nonfinite=None, time=2.0),
    ]
    models = MetricsPage(job_id=9, state="running", next_after=4,
                         items=[MetricRead.from_row(r) for r in rows]).model_dump_json()
    plain = to_json({"job_id": 9, "state": "running",
                     "items": [metric_item(r) for r in rows], "next_after": 4})
    assert plain.decode() == models
