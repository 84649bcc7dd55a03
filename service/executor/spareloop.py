"""A job's attempt loop started ahead of the job, so launching is a write to a pipe, not an interpreter
start (Python and the attempt loop's imports: ~70 ms of CPU, several times that on a loaded host).

The **spare attempt loop** (the word "standby" is the supervisor lease's: a server waiting to take
over). :class:`SpareLoop` keeps at most one ``python -m service.run.attemptloop --spare`` process, in a session
of its own, waiting on its stdin for one JSON line (``service.run.attemptloop.read_spare_request``): the
job's run directory and its whole environment (which holds the job token: a pipe, never an argv
or a file). :meth:`take` hands out the waiting process, :meth:`refill` starts the next one in the
background. A spare whose server went away reads end of input and exits. The first job after a
server start (and any job that finds no spare ready) starts its attempt loop the ordinary way.
"""

import json
import os
import subprocess
import threading
from collections.abc import Mapping

from torchyard_contract.childenv import environ_for_children
from torchyard_contract.rundir import RunDir

SPARE_FLAG = "--spare"


def build_spare_command(python: str) -> list[str]:
    """The argv of a spare attempt loop; pure."""
    return [python, "-m", "service.run.attemptloop", SPARE_FLAG]


def encode_request(run: RunDir, env: Mapping[str, str]) -> bytes:
    return json.dumps({"run": str(run.root), "env": dict(env)}).encode() + b"\n"


class SpareLoop:
    def __init__(self, python: str) -> None:
        self.python = python
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()
        self._closed = False

    def take(self, run: RunDir, env: Mapping[str, str]) -> subprocess.Popen[bytes] | None:
        """The waiting attempt loop, now running the job in ``run`` with ``env``; None when there is
        none ready (the caller starts one the ordinary way)."""
        with self._lock:
            proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None or proc.stdin is None:
            return None
        try:
            proc.stdin.write(encode_request(run, env))
            proc.stdin.close()
        except OSError:
            proc.kill()
            proc.wait()
            return None
        return proc

    def refill(self) -> None:
        """Start the next spare in the background: never on the launching thread's time."""
        threading.Thread(target=self._spawn, daemon=True, name="torchyard-spare-loop").start()

    def _spawn(self) -> None:
        with self._lock:
            if self._proc is not None or self._closed:
                return
            self._proc = subprocess.Popen(
                build_spare_command(self.python),
                cwd="/",
                env=environ_for_children(os.environ),
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,  # until it has a job: then RUN_DIR/attempt-loop.log
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )

    def close(self) -> None:
        """Let the waiting attempt loop go (it reads end of input and exits)."""
        with self._lock:
            self._closed = True
            proc, self._proc = self._proc, None
        if proc is not None and proc.stdin is not None:
            proc.stdin.close()
            proc.wait(timeout=10)
