"""``python -m service.run.ranktee --run-dir RUN_DIR --attempt N -- PROGRAM...``: one rank's program,
with everything it prints kept in one place.

torchrun starts this in the rank's place (the job's attempt loop puts it in front of every rank
program), with its stdout and stderr already redirected to the rank's ``stdout.log`` and
``stderr.log``. It runs ``python PROGRAM...`` with a pipe per stream and copies whatever arrives
both to that stream's own file, unchanged, and to ``RUN_DIR/logs/attempt-N/rank-<RANK>.log``
(``RunDir.rank_output``): both streams in the order they were written — exact within a stream;
across streams exact unless both were written within one read of each other (the program runs
unbuffered, ``PYTHONUNBUFFERED=1``, so a print is one write).

Contract: exits with the program's exit code, or dies of the signal that ended it, so torchrun
and the attempt loop see what they would have seen without it. SIGTERM, SIGINT and SIGHUP are passed on
to the program (which also gets them directly when its process group is signalled, as torchrun
and the attempt loop do) and never end this process first, so no output is lost. Output left behind
by a process the program started is read for ``DRAIN_S`` after the program exits, no longer.
The standard library only: it runs in every rank.
"""

import argparse
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from torchyard_contract.rundir import RunDir

READ_BYTES = 65536
DRAIN_S = 1.0
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def wrap(run: RunDir, attempt: int, program: tuple[str, ...]) -> tuple[str, ...]:
    """The rank program that runs ``program`` under this module; pure."""
    return (
        "-m", "service.run.ranktee", "--run-dir", str(run.root), "--attempt", str(attempt), "--",
        *program,
    )


def _write(fd: int, data: bytes) -> None:
    """Write all of ``data``; an error (a full disk) loses this copy, never stops the rank."""
    try:
        while data:
            data = data[os.write(fd, data):]
    except OSError:
        pass


def copy_streams(streams: dict[int, int], combined: int, done: Callable[[], bool]) -> None:
    """Copy each readable fd of ``streams`` (pipe fd → own output fd) to its output and to
    ``combined`` until every pipe is closed, or ``DRAIN_S`` after ``done()`` turned true."""
    sel = selectors.DefaultSelector()
    for fd in streams:
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ)
    deadline = None
    while sel.get_map():
        if deadline is None and done():
            deadline = time.monotonic() + DRAIN_S
        if deadline is not None and time.monotonic() > deadline:
            break
        for key, _ in sel.select(timeout=0.2):
            try:
                data = os.read(key.fd, READ_BYTES)
            except BlockingIOError:
                continue
            if not data:
                sel.unregister(key.fd)
                continue
            _write(streams[key.fd], data)
            _write(combined, data)
    sel.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m service.run.ranktee")
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--attempt", type=int, required=True)
    parser.add_argument("program", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    program = args.program[1:] if args.program[:1] == ["--"] else args.program
    rank = int(os.environ.get("RANK", "0"))  # set by torchrun for every rank
    path = RunDir(args.run_dir).rank_output(args.attempt, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    child = subprocess.Popen([sys.executable, *program], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    for sig in FORWARDED:
        signal.signal(sig, lambda signum, _frame: child.send_signal(signum))
    assert child.stdout is not None and child.stderr is not None
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        copy_streams(
            {child.stdout.fileno(): sys.stdout.fileno(), child.stderr.fileno(): sys.stderr.fileno()},
            fd, lambda: child.poll() is not None,
        )
    finally:
        os.close(fd)
    code = child.wait()
    if code < 0:  # killed by a signal: die of it too, as torchrun would have seen the rank do
        sig = signal.Signals(-code)
        if sig in FORWARDED:
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        code = 128 + sig  # a signal whose default is not to end a process: the shell's code
    sys.exit(code)


if __name__ == "__main__":
    main()
