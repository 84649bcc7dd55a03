"""A rank's heartbeat: the ready marker's mtime, touched as training makes progress.

The job's attempt loop (``service.run.attemptloop``) fails an attempt whose rank has not touched its marker for
``heartbeat_timeout_s``. A file, not an HTTP call, so it works while the API is down.
"""

import os
import time
from pathlib import Path

BEAT_INTERVAL_S = 1.0  # at most one touch a second: cheap even with tiny batches


class Heartbeat:
    def __init__(self, marker: Path) -> None:
        """Creates ``marker`` (the 'ready' signal: set-up finished) and beats once."""
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
        self._marker = marker
        self._last = time.monotonic()

    def beat(self) -> None:
        now = time.monotonic()
        if now - self._last >= BEAT_INTERVAL_S:
            os.utime(self._marker)
            self._last = now
