"""``service.api.hotreads``: equal reads in flight are made once, and never more than the bound run
at once (real threads, real event loop)."""

import asyncio
import threading
import time

import pytest

from service.api.hotreads import HotReads


class Counting:
    """A read that takes ``seconds`` and counts its calls and its peak concurrency."""

    def __init__(self, seconds: float = 0.05) -> None:
        self.seconds = seconds
        self.calls = 0
        self.running = 0
        self.peak = 0
        self._lock = threading.Lock()

    def __call__(self, value: object) -> object:
        with self._lock:
            self.calls += 1
            self.running += 1
            self.peak = max(self.peak, self.running)
        time.sleep(self.seconds)
        with self._lock:
            self.running -= 1
        if isinstance(value, Exception):
            raise value
        return value


def test_streams_woken_together_share_one_read_per_key() -> None:
    read = Counting()

    async def main() -> list[object]:
        reads = HotReads()
        same = [reads.shared(("job", 1, 5), read, "a") for _ in range(100)]
        other = [reads.shared(("job", 1, 6), read, "b") for _ in range(3)]
        return await asyncio.gather(*same, *other)

    results = asyncio.run(main())
    assert results == ["a"] * 100 + ["b"] * 3
    assert read.calls == 2


def test_a_read_is_shared_only_while_in_flight() -> None:
    read = Counting(0.0)

    async def main() -> None:
        reads = HotReads()
        for _ in range(3):
            await reads.shared("key", read, 1)

    asyncio.run(main())
    assert read.calls == 3  # a finished read is never handed to a later caller


def test_one_caller_going_away_does_not_cancel_the_read_the_others_await() -> None:
    read = Counting(0.2)

    async def main() -> tuple[object, bool]:
        reads = HotReads()
        leaving = asyncio.ensure_future(reads.shared("key", read, "x"))
        staying = asyncio.ensure_future(reads.shared("key", read, "x"))
        await asyncio.sleep(0.05)
        leaving.cancel()
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
    read = Counting(0.02)

    async def main() -> None:
        reads = HotReads(limit)
        await asyncio.gather(*(reads.run(read, i) for i in range(20)))

    asyncio.run(main())
    assert read.calls == 20
    assert read.peak == limit
