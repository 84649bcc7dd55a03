"""A pause reaching a running attempt (docs/lifecycle.md, "Pause and resume").

The supervisor asks by writing ``RUN_DIR/pause.json`` (``RunDir.pause_request``). The attempt
loop polls for it; when it appears:

1. the launcher tells the ranks (``Launcher.tell_pause``, ``service.run.launcher``): locally
   every rank program gets SIGTERM at once (cold ranks below the attempt loop, warm ones as the
   warm server names them: ``service.run.rankprocs``). The built-in trainer and a script
   that calls ``worker.should_stop()`` take it as "stop at the next epoch's end with a
   checkpoint" and exit 0; a script that handles SIGTERM itself does what it does; any other
   script ends at once, as Python's default SIGTERM action ends it, and resumes later the way it
   would after a restart. On Slurm the ranks are on other hosts: ``worker.should_stop()`` sees
   the file on the shared directory instead, and a script without it gets SIGTERM only when
   the grace is over (the group's stop, as for a cancel);
2. once ``pause_grace_s`` (the spec's) has passed, whatever still runs is stopped as a cancel
   stops it: SIGTERM → ``stop_grace_s`` → SIGKILL.

However the attempt then ends, it ended because of the pause: the job's outcome is ``paused``
and the attempt is no failure (no restart is used). A request already there before an attempt
starts (it came during a restart's backoff) ends the launch without starting one.
"""

import time
from dataclasses import dataclass

from service.run.launcher import Launcher
from torchyard_contract.launch import LaunchConfig
from torchyard_contract.rundir import RunDir

PAUSED_REASON = "paused"


@dataclass
class PauseWatch:
    run: RunDir
    config: LaunchConfig
    launcher: Launcher  # how the ranks are told (service.run.launcher)
    seen_at: float | None = None  # monotonic time the request was first seen, None before

    @property
    def requested(self) -> bool:
        """The pause was asked (seen by a poll, or there now)."""
        if self.seen_at is None and self.run.pause_request.exists():
            self.seen_at = time.monotonic()
        return self.seen_at is not None

    def grace_over(self) -> bool:
        """Polled while an attempt runs: tells the ranks when the request first appears; True
        once ``pause_grace_s`` has passed since (the group is to be stopped now)."""
        if self.seen_at is None:
            if not self.requested:
                return False
            self._tell_ranks()
            return False
        return time.monotonic() - self.seen_at > self.config.pause_grace_s

    def _tell_ranks(self) -> None:
        told = self.launcher.tell_pause(self.run, self.config)
        if told is None:
            return  # on other hosts: they read the request file (worker.should_stop)
        print(f"pause requested: SIGTERM sent to {told} rank(s); "
              f"{self.config.pause_grace_s:g} s to stop", flush=True)
