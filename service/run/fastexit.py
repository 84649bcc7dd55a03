"""Ending a program as ``python`` does, short of tearing the interpreter down.

``python -m service.run.fastexit -m MODULE ARGS`` runs ``MODULE`` as ``python -m MODULE ARGS``
would and ends the process with :func:`finish`. The attempt loop starts torchrun's agent this way
when cold (here and on every Slurm node), and a cold rank whose program is ``-m MODULE`` (the
built-in trainer, a script job's module; :func:`wrap`); warm ones end through the same
:func:`finish`. Tearing down the torch a process imported took 0.5–2.5 s on 2 cores after its
last statement (0.65 CPU s measured for torchrun's agent), all of it between the job's end and
``succeeded``.

:func:`finish` does what ``Py_FinalizeEx`` does that a program can observe — join the non-daemon
threads, run the ``atexit`` handlers (printing an exception in one, as Python does), flush every
file object still open and stdio — then ``os._exit`` with the program's status (``SystemExit``'s
code as Python maps it; 1 after an uncaught exception, whose traceback was printed; death by
SIGINT after an uncaught ``KeyboardInterrupt``). Modules are not torn down: no ``__del__`` of a
module global runs, which no program may rely on (Python does not promise it either). The
standard library only.
"""

import atexit
import gc
import importlib
import io
import os
import runpy
import signal
import sys
import threading
import traceback
from typing import NoReturn

# ``python`` arguments that run what follows them (``-m MODULE ARGS``) under this module.
PREFIX = ("-m", "service.run.fastexit")
_FILE_TYPES = frozenset({io.TextIOWrapper, io.BufferedWriter, io.BufferedRandom})


def exit_code(code: object) -> int:
    """The status ``python`` exits with for ``SystemExit(code)``: None → 0, an int as is (& 0xFF
    by the kernel), anything else printed on stderr → 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    try:
        print(code, file=sys.stderr)
    except Exception:  # noqa: BLE001  (a broken stderr: the code still says it failed)
        pass
    return 1


def finish(code: object, *, interrupted: bool = False) -> NoReturn:
    """End the process as the interpreter ends a program — non-daemon threads joined, ``atexit``
    handlers run (an exception in one printed, as Python does), unclosed files and stdio
    flushed — but without tearing down the modules the warm server preloaded: ``os._exit``.
    After an uncaught ``KeyboardInterrupt`` it dies of SIGINT, as ``python`` does."""
    status = exit_code(code)
    try:
        threading._shutdown()  # type: ignore[attr-defined]  # what Py_FinalizeEx does first
    except KeyboardInterrupt:
        interrupted = True
    except Exception:  # noqa: BLE001
        traceback.print_exc()
    try:
        atexit._run_exitfuncs()  # prints (and swallows) a handler's exception, as at exit
    except KeyboardInterrupt:
        interrupted = True
    flush_open_files()
    if interrupted:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(status & 0xFF)


def flush_open_files() -> None:
    """What the teardown of a program's modules would flush: every file object still open
    (text layers first, then their buffers), then stdio. A failure (a full disk) is printed as
    Python prints one at exit, and the rest are still flushed."""
    # A warm server froze what it preloaded (gc.freeze): then only what the job made is walked.
    found = [o for o in gc.get_objects() if type(o) in _FILE_TYPES]
    found.sort(key=lambda o: type(o) is not io.TextIOWrapper)
    for stream in [*found, sys.stdout, sys.stderr]:
        try:
            if stream is not None and not stream.closed:
                stream.flush()
        except Exception as exc:  # noqa: BLE001
            try:
                print(f"Exception ignored while flushing {stream!r}: {exc!r}", file=sys.stderr)
            except Exception:  # noqa: BLE001
                pass


def wrap(program: tuple[str, ...]) -> tuple[str, ...]:
    """A cold rank's ``python`` arguments ending through :func:`finish`: ``-m MODULE ARGS``
    under this module; a script path as it is (``python SCRIPT`` puts the script's directory,
    not the working directory, first on ``sys.path``, which ``-m`` here would not). Pure."""
    if len(program) >= 2 and program[0] == "-m":
        return (*PREFIX, *program)
    return program


def import_parents(module: str) -> None:
    """Import the packages above ``module`` — what runpy imports first anyway — with the cyclic
    collector off: for torchrun's agent that is all of torch, whose imports spent 0.18 CPU s
    (of 2.4) in collector passes over modules that live as long as the process. A package
    that fails to import is left for runpy to import again and report, as ``python -m`` does."""
    parent = module.rpartition(".")[0]
    if not parent:
        return
    enabled = gc.isenabled()
    gc.disable()
    try:
        importlib.import_module(parent)
    except Exception:  # noqa: BLE001  (runpy raises it again, worded as python -m words it)
        pass
    finally:
        if enabled:
            gc.enable()


def run_module(argv: list[str]) -> NoReturn:
    """``argv``: ``["-m", MODULE, *args]``; run it as ``__main__`` and :func:`finish`."""
    if len(argv) < 2 or argv[0] != "-m":
        print("usage: python -m service.run.fastexit -m MODULE [ARGS...]", file=sys.stderr)
        finish(2)
    sys.argv = [argv[1], *argv[2:]]
    import_parents(argv[1])
    try:
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        finish(exc.code)
    except BaseException as exc:  # noqa: BLE001  (uncaught: traceback, then exit 1 or SIGINT)
        tb = exc.__traceback__.tb_next if exc.__traceback__ is not None else None
        sys.excepthook(type(exc), exc.with_traceback(tb), tb)
        finish(1, interrupted=isinstance(exc, KeyboardInterrupt))
    finish(0)


if __name__ == "__main__":
    run_module(sys.argv[1:])
