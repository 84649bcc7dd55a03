"""Start-up probe for the orchestration benchmark; active only when ``TORCHYARD_BENCH_PROBE`` is set.

Put this directory first on ``PYTHONPATH`` and every Python process of a job (attempt loop, torchrun
agent, ranks) appends JSON lines ``{"pid", "role", "rank", "event", "t"}`` to
``bench-probe.jsonl`` in its working directory (the job's run directory for all three): ``exec`` (kernel start time of the process), ``site`` (interpreter
ready). Ranks (``-m worker``) also log ``torch_imported``, ``worker_imported``,
``rendezvous_done``, ``data_loaded``, ``ready`` (model and DDP built: the heartbeat marker),
``first_step`` (first optimizer step done) and ``exit``. The rank's imports happen here instead of
in ``worker.__main__``, in the same order, so the probe moves no work, it only timestamps it.
Benchmark use only; never installed with the package.
"""

import os
import sys
import time

_SITE_T = time.time()
_FILE = os.environ.get("TORCHYARD_BENCH_PROBE")
PROBE_FILE = "bench-probe.jsonl"


def _exec_time() -> float:
    """When the kernel started this process (clock-tick resolution), from /proc, in Unix time."""
    with open("/proc/self/stat", encoding="ascii") as f:
        start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/uptime", encoding="ascii") as f:
        uptime_s = float(f.read().split()[0])
    return time.time() - (uptime_s - start_ticks / os.sysconf("SC_CLK_TCK"))


def _role(argv: list[str]) -> str:
    joined = " ".join(argv)
    if "warm/relay.py" in joined:  # a warm start's relay (torchrun agent or rank): exec only
        return "relay"
    if "service.run.attemptloop" in joined:
        return "attempt loop"
    if "torch.distributed.run" in joined or "torchrun" in joined:
        return "agent"
    if "-m worker" in joined:
        return "rank"
    return "other"


def _install() -> None:
    import atexit
    import json

    argv = list(getattr(sys, "orig_argv", sys.argv))
    role = _role(argv)
    if role == "other" or "--spare" in argv:
        return  # a spare attempt loop starts before its job (and outside any run directory)
    rank = os.environ.get("RANK")
    path = os.path.join(os.getcwd(), PROBE_FILE)

    def emit(event: str, t: float | None = None) -> None:
        line = {"pid": os.getpid(), "role": role, "rank": rank, "event": event,
                "t": time.time() if t is None else t}
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(line) + "\n")

    emit("exec", _exec_time())
    emit("site", _SITE_T)
    atexit.register(emit, "exit")
    if role != "rank":
        return
    import torch  # noqa: F401  (the worker's first import; timed here)

    emit("torch_imported")
    import torch.distributed as dist

    from worker import train

    emit("worker_imported")
    init = dist.init_process_group

    def init_process_group(*args, **kwargs):  # type: ignore[no-untyped-def]
        result = init(*args, **kwargs)
        emit("rendezvous_done")
        return result

    dist.init_process_group = init_process_group  # type: ignore[assignment]
    load = train.load_dataset

    def load_dataset(*args, **kwargs):  # type: ignore[no-untyped-def]
        result = load(*args, **kwargs)
        emit("data_loaded")
        return result

    train.load_dataset = load_dataset  # type: ignore[assignment]
    heartbeat_init, beat = train.Heartbeat.__init__, train.Heartbeat.beat
    first = [True]

    def patched_init(self, marker):  # type: ignore[no-untyped-def]
        heartbeat_init(self, marker)
        emit("ready")

    def patched_beat(self):  # type: ignore[no-untyped-def]
        if first[0]:
            first[0] = False
            emit("first_step")
        beat(self)

    train.Heartbeat.__init__ = patched_init  # type: ignore[method-assign]
    train.Heartbeat.beat = patched_beat  # type: ignore[method-assign]


if _FILE:
    _install()
