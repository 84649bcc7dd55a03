"""What the warm server imports before it forks, and what a job must share with it to start warm.

:func:`preload` imports the modules (recording every variable their Python code read:
``READ_AT_IMPORT``); :func:`refusal` says why a relay's job cannot run in a process that
imported them — another interpreter or flags, a variable read at import time whose value
differs (:func:`import_time_mismatch`), a preloaded package the job's path has its own copy of
(:func:`shadowed`), CUDA initialised — or None. See ``service.run.warm.server``.
"""

import gc
import importlib
import importlib.machinery
import os
import sys
from collections.abc import Iterator, Set
from contextlib import contextmanager

from service.run.warm import relay

PASSED_THROUGH = frozenset({"PYTHONPATH", "PYTHONSAFEPATH", "PYTHONUNBUFFERED", "OMP_NUM_THREADS"})
# Read when the interpreter, the C libraries or torch start, so a warm process keeps the server's
# values — besides what the preload's Python code reads (recorded: READ_AT_IMPORT): the dynamic
# loader (LD_*), Python (PYTHON*), glibc (MALLOC_*, GLIBC_TUNABLES), the thread pools torch and
# numpy load (OMP_*, MKL_*, KMP_*, GOMP_*, OPENBLAS_*), and torch, whose C++ core reads
# TORCH_LOGS, TORCH_SHOW_CPP_STACKTRACES, TORCH_CPP_LOG_LEVEL... (and all of TORCH*/PYTORCH_*,
# whether read by C++ or Python, now or in a later version).
IMPORT_TIME_PREFIXES = (
    "LD_", "PYTHON", "MALLOC_", "OMP_", "MKL_", "KMP_", "GOMP_", "OPENBLAS_", "TORCH", "PYTORCH_",
)
IMPORT_TIME_NAMES = frozenset({"GLIBC_TUNABLES"})
# ... but these are read only after the hand-off, when the job's code uses them: torchyard's and
# torchrun's own (every rank's differ), and TORCH_NCCL_* (read when an NCCL process group is made;
# torchrun sets TORCH_NCCL_ASYNC_ERROR_HANDLING on every rank).
RUN_TIME_PREFIXES = ("TORCHYARD_", "TORCHELASTIC_", "TORCH_NCCL_")


def read_at_start_up(name: str, read: Set[str] = frozenset()) -> bool:
    """Whether the variable ``name`` is read when the interpreter, its C libraries or torch
    start (or is in ``read``: what the preload read), so a job must share its value with the
    warm server; not the ones passed through or read only after the hand-off."""
    if name in PASSED_THROUGH or name.startswith(RUN_TIME_PREFIXES):
        return False
    return name in read or name in IMPORT_TIME_NAMES or name.startswith(IMPORT_TIME_PREFIXES)


def import_time_mismatch(
    job_env: dict[str, str], own_env: dict[str, str], read: Set[str] = frozenset()
) -> str | None:
    """The first variable read at start-up (:func:`read_at_start_up`) whose job value
    differs."""
    for name in sorted(set(job_env) | set(own_env)):
        if read_at_start_up(name, read) and job_env.get(name) != own_env.get(name):
            return name
    return None


def shadowed(path: list[str]) -> str | None:
    """A preloaded package the job's ``sys.path`` would find elsewhere (its own torch, say):
    a warm process would run the server's copy instead, so the job must start cold."""
    for top in sorted({name.partition(".")[0] for name in PRELOADED}):
        loaded = getattr(sys.modules.get(top), "__file__", None)
        spec = importlib.machinery.PathFinder.find_spec(top, path)
        if loaded and spec is not None and spec.origin and \
                os.path.realpath(spec.origin) != os.path.realpath(loaded):
            return f"the job's path has its own {top} ({spec.origin})"
    return None


PRELOADED: list[str] = []
# The environment the server started with: what a job's is compared to. Not os.environ now:
# preloading changes it (scikit-learn sets KMP_DUPLICATE_LIB_OK and KMP_INIT_AT_FORK), as the
# same imports would in a cold rank.
STARTED_ENV: dict[str, str] = dict(os.environ)
# Every variable the preload read (os.environ[...], .get, os.getenv, `in`), set or not: a module
# may have kept what it read (TORCHINDUCTOR_*, SKLEARN_*, TMPDIR through tempfile, ...), so a job
# whose value differs starts cold.
READ_AT_IMPORT: set[str] = set()


@contextmanager
def environ_reads() -> Iterator[set[str]]:
    """The names read from ``os.environ`` inside the block (all reads go through
    ``os._Environ.__getitem__``: ``get``, ``getenv`` and ``in`` too)."""
    names: set[str] = set()
    cls = type(os.environ)
    original = cls.__getitem__

    def recording(env: object, key: str) -> str:
        names.add(key)
        return original(env, key)  # type: ignore[arg-type]

    cls.__getitem__ = recording  # type: ignore[method-assign,assignment]
    try:
        yield names
    finally:
        cls.__getitem__ = original  # type: ignore[method-assign]


def preload(modules: list[str]) -> None:
    """Import what ranks would import first; a module that is missing is skipped.

    The garbage collector is off meanwhile: importing torch and torch._dynamo makes ~500,000
    objects, and the collections they set off took a sixth of the preload's CPU (2.96 → 2.47 CPU
    s, ``bench/procstart.py``). The few cycles it would have freed (~8 MiB) are frozen with the
    rest after it (``gc.freeze`` in the server) and shared by every child."""
    gc_was_on = gc.isenabled()
    gc.disable()
    try:
        with environ_reads() as read:
            for name in modules:
                try:
                    importlib.import_module(name)
                except ImportError as exc:
                    print(f"warm server: not preloading {name}: {exc}", file=sys.stderr,
                          flush=True)
                    continue
                PRELOADED.append(name)
        READ_AT_IMPORT.update(read)
    finally:
        if gc_was_on:
            gc.enable()


def refusal(message: dict) -> str | None:
    """Why the job of a relay's ``message`` cannot start in a warm process; None if it can."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "CUDA was initialised in the warm server (refusing to share it)"
    if message.get("executable") != os.path.realpath(sys.executable):
        return f"interpreter {message.get('executable')} is not the warm server's"
    theirs, ours = message.get("flags") or {}, relay.flags()
    differ = sorted(k for k in ours
                    if k not in relay.REPRODUCED_FLAGS and theirs.get(k) != ours[k])
    if differ:
        return f"interpreter flags differ from the warm server's: {', '.join(differ)}"
    name = import_time_mismatch(dict(message.get("env") or {}), STARTED_ENV, READ_AT_IMPORT)
    if name is not None:
        return f"the job sets {name}, which is read when Python or torch starts"
    return shadowed(list(message.get("path") or []))
