"""What idle servers take from the rest of the host: a CPU-bound peer (one counting process per
core) runs alone, beside N idle servers (default settings: warm ranks on, pool ready), and alone
again; the figure is the peer's throughput beside them over its mean alone.

Measured as throughput, not as the servers' CPU counters: the kernel charges CPU time by the
timer tick, so a thread that wakes briefly and often (a poll loop) is charged whole ticks or
none, and its counters say little about what it costs the host.
"""

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import Row
from bench.endpath import wait_warm
from bench.server import Server

PEER = (
    "import sys, time\n"
    "n, end = 0, time.monotonic() + float(sys.argv[1])\n"
    "while time.monotonic() < end:\n"
    "    for _ in range(10000):\n"
    "        n += 1\n"
    "print(n)\n"
)
SETTLE_S = 5.0  # after the pools are ready: start-up work is over


def peer_throughput(seconds: float) -> int:
    """Loop iterations of one counting process per core, summed, over ``seconds``."""
    procs = [subprocess.Popen([sys.executable, "-c", PEER, str(seconds)], stdout=subprocess.PIPE,
                              text=True) for _ in range(os.cpu_count() or 1)]
    return sum(int(p.communicate()[0]) for p in procs)


def run(smoke: bool) -> list[Row]:
    count, seconds = (2, 2.0) if smoke else (8, 20.0)
    alone = peer_throughput(seconds)
    with tempfile.TemporaryDirectory() as tmp:
        servers = [Server.start(Path(tmp) / f"home{i}", env={"TORCHYARD_WARM_RANKS": "true"})
                   for i in range(count)]
        try:
            for server in servers:
                wait_warm(server, idle=0)
            time.sleep(0 if smoke else SETTLE_S)
            beside = peer_throughput(seconds)
        finally:
            for server in servers:
                server.stop()
    alone = (alone + peer_throughput(seconds)) / 2
    ratio = beside / alone
    cores = os.cpu_count() or 1
    per_server = max(0.0, 1 - ratio) * cores / count * 100
    return [
        Row("idle", f"peer throughput beside {count} idle servers / alone", round(ratio, 3), "x",
            "", f"one counting process per core, {seconds:.0f} s; mean of a run before and after"),
        Row("idle", "what one idle server takes", round(per_server, 2), "% of a core", "<= 1",
            "server, warm pool and warm server, default settings"),
    ]
