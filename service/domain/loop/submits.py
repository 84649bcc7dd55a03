"""Submissions that run off the supervisor's loop.

On Slurm, ``executor.submit`` is a process (``sbatch``) that may take as long as its timeout
(``TORCHYARD_SLURM_COMMAND_TIMEOUT_S``). The loop hands each job to one of a few threads and
collects the answer on a later tick, so one slow or hung submit holds neither the other jobs'
submits nor the reaping, cancels and state changes the loop does meanwhile. Only the loop's
thread calls these methods; a finished submit wakes the loop (``wake``).
"""

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

# Submits in flight at once: more queue behind them (each has a timeout, so they drain).
SUBMIT_THREADS = 4


class Submits:
    def __init__(self, wake: Callable[[], None], threads: int = SUBMIT_THREADS) -> None:
        self._wake = wake
        self._threads = threads
        self._pool: ThreadPoolExecutor | None = None
        self._running: dict[int, Future[str]] = {}

    def busy(self, job_id: int) -> bool:
        """True while the job's submit runs."""
        return job_id in self._running

    @property
    def full(self) -> bool:
        return len(self._running) >= self._threads

    def start(self, job_id: int, submit: Callable[[], str]) -> None:
        """Run ``submit`` (returns the executor's reference, or raises) on a submit thread."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self._threads, thread_name_prefix="torchyard-submit")
        future = self._pool.submit(submit)
        self._running[job_id] = future
        future.add_done_callback(lambda _future: self._wake())

    def finished(self) -> list[tuple[int, Future[str]]]:
        """The submits that ended since the last call (job id, its future), in start order."""
        done = [(job_id, future) for job_id, future in self._running.items() if future.done()]
        for job_id, _ in done:
            del self._running[job_id]
        return done

    def close(self) -> None:
        """Start nothing more; a submit running now ends at its own timeout."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
