"""What a warm server's child does once a relay hands it a job: become that rank program.

:func:`become` takes the relay's request (``service.run.warm.relay.request``) and its stdin, stdout
and stderr, and runs the program as ``python <argv>`` would, in this process that already
imported torch: a session of its own; the relay's stdio on fds 0-2 (``-u`` honoured); the job's
environment, working directory and ``sys.path``; torch's thread count from ``OMP_NUM_THREADS``
(torch read the variable when the server imported it); fresh random state. Then it exits as the
interpreter would (see :func:`become`): ``SystemExit`` code, 1 after an uncaught exception
(traceback on stderr), killed by SIGINT after an uncaught ``KeyboardInterrupt``.

The end (``service.run.fastexit.finish``) is what ``python`` does when a program ends, short of tearing the
interpreter down: join the non-daemon threads, run the ``atexit`` handlers, flush every open file
and stdio, then ``os._exit`` with the program's code. Tearing down the preloaded torch,
torchvision and scikit-learn took about 2 s per process on 2 cores, after the job's last
statement, for nothing: the process is gone a moment later anyway.
"""

import io
import os
import random
import runpy
import signal
import sys
from types import TracebackType
from typing import NoReturn

from service.run.fastexit import finish
from service.run.proctree import allow_tracer
from torchyard_contract.envnames import STACKS_TRACER


def _stdio(unbuffered: bool) -> None:
    """New ``sys.std*`` on fds 0-2, buffered as ``python [-u]`` would buffer them."""
    def writer(fd: int, errors: str) -> io.TextIOWrapper:
        tty = os.isatty(fd)
        raw = io.FileIO(fd, "w", closefd=False)
        buffer = io.BufferedWriter(raw) if not unbuffered else raw
        return io.TextIOWrapper(
            buffer, encoding="utf-8", errors=errors,  # type: ignore[arg-type]
            line_buffering=tty or (fd == 2 and not unbuffered), write_through=unbuffered,
        )

    sys.stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)),
                                 encoding="utf-8")
    sys.stdout = writer(1, "strict")
    sys.stderr = writer(2, "backslashreplace")
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr


def _threads_from_env(env: dict[str, str]) -> None:
    torch = sys.modules.get("torch")
    if torch is None:
        return
    raw = env.get("OMP_NUM_THREADS", "").strip()
    try:
        threads = int(raw)
    except ValueError:
        return  # unset or not a number: torch's own default, as a cold start would have it
    if threads > 0:
        torch.set_num_threads(threads)


def _reseed() -> None:
    """A forked child shares the server's random state; a fresh interpreter would not."""
    random.seed()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()


def _apply(message: dict, fds: list[int]) -> None:
    os.setsid()
    for target, fd in zip((0, 1, 2), fds, strict=False):
        os.dup2(fd, target)
    for fd in fds:
        if fd > 2:
            os.close(fd)
    os.chdir(message["cwd"])
    env = {str(k): str(v) for k, v in dict(message["env"]).items()}
    # The job's attempt loop takes the ranks' stacks (service.run.stackdump); a warm rank is not below it.
    # Out of a rank's environment (a cold rank has no such variable); torchrun's agent keeps it
    # for the ranks it starts.
    tracer = env.pop(STACKS_TRACER, "") if "RANK" in env else env.get(STACKS_TRACER, "")
    os.environ.clear()
    os.environ.update(env)
    sys.path[:] = list(message["path"])
    _stdio(bool(message.get("unbuffered")))
    _threads_from_env(env)
    _reseed()
    if tracer.isdigit():
        allow_tracer(int(tracer))
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_DFL)


def _run(argv: list[str]) -> None:
    if argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    elif argv[0] == "-c":
        sys.argv = ["-c", *argv[2:]]
        exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__"})  # noqa: S102
    else:
        sys.argv = list(argv)
        runpy.run_path(argv[0], run_name="__main__")


def _job_traceback(tb: TracebackType | None) -> TracebackType | None:
    """The traceback from the job's code on (as a cold interpreter prints it): this module's
    frames, and the warm server's below them, are not the job's."""
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    return tb


def become(message: dict, fds: list[int]) -> NoReturn:
    """Run the job's program in this process and end it as ``python`` would (``finish``)."""
    try:
        _apply(message, fds)
        _run(list(message["argv"]))
    except SystemExit as exc:
        finish(exc.code)
    except BaseException as exc:  # noqa: BLE001  (uncaught: traceback, then exit 1 or SIGINT)
        tb = _job_traceback(exc.__traceback__)
        sys.excepthook(type(exc), exc.with_traceback(tb), tb)  # the hook prints exc's own
        finish(1, interrupted=isinstance(exc, KeyboardInterrupt))
    finish(0)
