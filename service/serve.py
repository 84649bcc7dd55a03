"""``torchyard serve --workers N``: N API processes, each with its own listening socket.

(The flag keeps uvicorn's word; in torchyard's code and docs these are *API processes*, and
"worker" names only the rank-side package ``worker/``.)

Why not ``uvicorn --workers``: its processes share one listening socket, and whichever is awake
in ``accept`` takes a whole burst of connections. Keep-alive clients then stay on that process:
200 dashboards that connected at once all landed on one of two processes (12.1 vs 0.8
CPU-seconds in docs/benchmarks.md, "Stores and API processes"). Here each API process has a
listening socket of its own on the port (``SO_REUSEPORT``) and the kernel spreads new
connections over them by address. The parent opens all of them before any process starts, so
connections made while one is still starting wait in its socket instead of all going to the
first one up, and a process that is restarted gets its socket (and the connections waiting in
it) back. With ``--fd`` (socket activation) the inherited socket is the first process's, and
the others get sockets of their own on its address where it allows that (``SO_REUSEPORT``);
else they all accept from it.

Each API process is a fresh interpreter (``spawn``: nothing of the parent's threads or
connections is inherited) that builds the app from ``TORCHYARD_*``
(``create_app_from_environment``) and serves it through ``DrainingServer``, so streams and long
polls end within the grace on shutdown as with one process. Their Prometheus counters are summed
across them (``PROMETHEUS_MULTIPROC_DIR``, a fresh directory per run). The parent only watches:
SIGTERM/SIGINT go to every API process; one that dies is started again, unless they keep dying
(then the parent stops them all and exits 1); one whose parent died gets SIGTERM
(``PR_SET_PDEATHSIG``) and drains.
"""

import gc
import logging
import multiprocessing
import multiprocessing.connection
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections import deque
from multiprocessing.process import BaseProcess
from types import FrameType

from prometheus_client.multiprocess import mark_process_dead

from service.api.drain import SHUTDOWN_GRACE_S
from service.api.routes.prometheus import PROMETHEUS_DIR_VARIABLE
from service.run import proctree

logger = logging.getLogger(__name__)

BACKLOG = 2048  # uvicorn's default
# More deaths than API processes within this window: something is wrong with every one (the port
# is taken, the database unreachable); restarting would only loop.
RESTART_WINDOW_S = 30.0
STOP_TIMEOUT_S = SHUTDOWN_GRACE_S + 10.0


def listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` that other processes may bind too."""
    sock = socket.socket(_family(host), socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host.strip("[]"), port))
    sock.listen(BACKLOG)
    return sock


def listen_all(host: str, port: int, count: int) -> list[socket.socket]:
    """``count`` sockets on one port. Raises ``OSError`` when something already listens there:
    ``SO_REUSEPORT`` alone would let a second server (of the same user) share the port and
    silently take half its connections, so the port is first bound without it. Port 0: the
    first socket's port, for all of them."""
    probe = socket.socket(_family(host), socket.SOCK_STREAM)
    try:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT is fine
        probe.bind((host.strip("[]"), port))
        port = probe.getsockname()[1]
    finally:
        probe.close()
    return [listen(host, port) for _ in range(count)]


def inherited_socket(fd: int) -> socket.socket:
    """The listening TCP socket this process inherited as ``fd`` (``torchyard serve --fd``:
    socket activation, where a service manager binds the port and starts the server with the
    socket already open, so connections wait in it from the first instant). Raises ``OSError``
    when ``fd`` is not open, not a socket, or not a listening TCP one."""
    sock = socket.socket(fileno=fd)  # family and type are read from the descriptor
    if (sock.family not in (socket.AF_INET, socket.AF_INET6) or sock.type != socket.SOCK_STREAM
            or not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)):
        sock.detach()  # not ours to close
        raise OSError(f"file descriptor {fd} is not a listening TCP socket")
    return sock


def process_sockets(inherited: socket.socket, count: int) -> list[socket.socket]:
    """One socket per API process, the inherited one first. Where it was opened with
    ``SO_REUSEPORT`` (systemd's ``ReusePort=yes``) the others are new sockets on its address, so
    the kernel spreads connections over the processes as with ``--port``; otherwise (or where the
    kernel refuses: a socket opened by another user) every process accepts from the inherited
    one."""
    if inherited.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT):
        host, port = inherited.getsockname()[:2]
        siblings: list[socket.socket] = []
        try:
            for _ in range(count - 1):
                siblings.append(listen(host, port))
            return [inherited, *siblings]
        except OSError as exc:
            for sock in siblings:
                sock.close()
            logger.warning("--fd: the API processes share the inherited socket (%s)", exc)
    return [inherited] * count


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _api_process(sock: socket.socket, parent: int) -> None:
    """One API process: the app from the environment, served on its socket. ``parent``: the
    pid that started it (read there: by the time this runs it may already be gone)."""
    if not proctree.die_with_parent(signal.SIGTERM, parent):
        return  # the parent died before the death signal was armed
    gc.disable()  # until the app has started, as in ``torchyard serve`` (service.cli)
    from service.api.drain import serve
    from service.app import create_app_from_environment

    app = create_app_from_environment()
    serve(app, sockets=[sock])


def run_api_processes(
    host: str, port: int, count: int, inherited: socket.socket | None = None,
) -> int:
    """Run ``count`` API processes until SIGTERM/SIGINT; the exit status for the command. Raises
    ``OSError`` when the port cannot be bound (or something already listens on it).
    ``inherited``: the listening socket of ``--fd``, served instead of binding ``host:port``."""
    ctx = multiprocessing.get_context("spawn")
    sockets = process_sockets(inherited, count) if inherited else listen_all(host, port, count)
    processes: dict[int, BaseProcess] = {}
    stopping = False
    # Where the processes' Prometheus counters are summed; set before the first one imports
    # prometheus-client (it reads the variable then). Fresh per run: old counts are not ours.
    metrics_dir = tempfile.mkdtemp(prefix="torchyard-prometheus-")
    os.environ[PROMETHEUS_DIR_VARIABLE] = metrics_dir

    def start(index: int) -> BaseProcess:
        # The socket goes to the child duplicated (multiprocessing's socket pickling).
        proc = ctx.Process(target=_api_process, args=(sockets[index], os.getpid()),
                           name=f"torchyard-api-{index}")
        proc.start()
        return proc

    def terminate_all() -> None:
        for proc in processes.values():
            if proc.pid is not None and proc.is_alive():
                os.kill(proc.pid, signal.SIGTERM)

    def stop(_sig: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        terminate_all()

    # Before any API process starts: a stop signal during start-up is a stop, not the parent's death.
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    for index in range(count):
        if stopping:
            break
        processes[index] = start(index)
    deaths: deque[float] = deque()
    status = 0
    while not stopping:
        sentinels = {proc.sentinel: index for index, proc in processes.items()}
        for ready in multiprocessing.connection.wait(list(sentinels), timeout=1.0):
            index = sentinels[ready]  # type: ignore[index]
            processes[index].join()
            if stopping:
                break
            now = time.monotonic()
            deaths.append(now)
            while deaths and now - deaths[0] > RESTART_WINDOW_S:
                deaths.popleft()
            logger.error("API process %s (pid %s) exited with %s", index, processes[index].pid,
                         processes[index].exitcode)
            # Its counts stay in the sums (totals must not go down); only live gauges would go.
            mark_process_dead(processes[index].pid, metrics_dir)
            if len(deaths) > count:
                print(f"torchyard serve: API processes keep exiting ({len(deaths)} in "
                      f"{RESTART_WINDOW_S:.0f} s); stopping", file=sys.stderr)
                status = 1
                stopping = True
                break
            processes[index] = start(index)
    # Again: a process started while the signal was being handled did not get it.
    terminate_all()
    # The parent's copies of the sockets go now: once a process closes its own, new connections
    # are refused at once instead of waiting in a socket nobody accepts from.
    for sock in sockets:
        sock.close()
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for proc in processes.values():
        proc.join(max(0.0, deadline - time.monotonic()))
        if proc.is_alive():
            proc.kill()
            proc.join()
    shutil.rmtree(metrics_dir, ignore_errors=True)
    return status
