"""How much of the server process's CPU the exporter may take: it yields while the process is
busy with something else.

The exporter's threads share the interpreter (and its GIL) with the routes. Turning stored
records into MLflow points and TensorBoard events is ~10 µs of Python per record, a third of what
storing one costs, so an exporter that kept up with a saturating ingestion would slow it by a
third. While the rest of the process is busy (more than ``BUSY_SHARE`` of a core over the last
``WINDOW_S``), the exporter takes at most ``BUSY_EXPORT_SHARE`` of a core and falls behind; it
catches up as soon as the load drops. A training job's own pace (thousands of records a second)
fits in that share, so its export does not lag (docs/benchmarks.md, finding 16).
"""

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

WINDOW_S = 0.25  # short: a burst of records is met within a quarter second
BUSY_SHARE = 0.5  # of one core, the rest of the process: then the exporter is held back
BUSY_EXPORT_SHARE = 0.05  # of one core, the exporter's own while the process is busy


@dataclass
class CpuBudget:
    """Counts the CPU the exporter's threads spend (``spend``) against the whole process's
    (``process_time``) over windows of ``WINDOW_S``; ``allows`` says whether to hand out work."""

    process_time: Callable[[], float] = time.process_time
    clock: Callable[[], float] = time.monotonic
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _start: float | None = None
    _process_at_start: float = 0.0
    _spent: float = 0.0
    _held_back: bool = False

    def spend(self, cpu_s: float) -> None:
        with self._lock:
            self._spent += cpu_s

    def allows(self) -> bool:
        with self._lock:
            now, process = self.clock(), self.process_time()
            if self._start is None:
                self._start, self._process_at_start = now, process
                return True
            wall = now - self._start
            if wall >= WINDOW_S:  # a window ended: judge it, start the next
                rest = (process - self._process_at_start) - self._spent
                self._held_back = rest / wall > BUSY_SHARE
                self._start, self._process_at_start, self._spent = now, process, 0.0
                return True
            return not self._held_back or self._spent / max(wall, 1e-3) < BUSY_EXPORT_SHARE

    @property
    def held_back(self) -> bool:
        """The last window found the process busy: the exporter takes a small share now."""
        return self._held_back
