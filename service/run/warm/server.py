"""The warm server: ``python -u -m service.run.warm.server --socket PATH --pool N [--preload M,...]``.

A per-host fork server that has imported torch (and ``--preload``: torchvision, the worker's
modules, torchrun's agent). It keeps ``N`` idle children forked from itself; each serves exactly
one relay (``service.run.warm.relay``: the rank program torchrun starts) and becomes that program —
the relay's stdio, environment, working directory, ``sys.path`` and args — then exits. Idle
children are refilled in the background (never while a hand-off waits); with none idle a child
is forked on demand.

Isolation: nothing here touches CUDA (``status`` reports ``torch.cuda.is_initialized()``, which
stays false: a hand-off is refused if it ever became true); each child gets ``setsid``, Python's
default signal handlers, fresh random state, ``torch.set_num_threads(OMP_NUM_THREADS)`` and the
job's environment before the job's first statement. A relay whose interpreter, flags or
import-time variables differ from the server's is refused: it starts cold
(:func:`import_time_mismatch`: every variable the preload's Python code read, recorded while
preloading, and the families C code reads at start: ``TORCH*``/``PYTORCH_*``, ``LD_*``,
``PYTHON*`` but the path ones, ``OMP_*`` but ``OMP_NUM_THREADS``, ``MKL_*``, ``KMP_*``,
``GOMP_*``, ``OPENBLAS_*``, ``MALLOC_*``, ``GLIBC_TUNABLES``).

One per socket: the server holds an exclusive ``flock`` on ``server.lock`` next to its socket
from before it imports anything until it drains; a second server for the same socket exits at
once with ``BUSY_EXIT`` and never touches the first one's socket (``torchyard serve --workers N``
has N pools and one warm server). The socket's directory must be private (this user's, 0700, not
a symlink: ``relay.private_dir``); peers of another uid are refused (``SO_PEERCRED``).

Lifetime: children die with the server (``PR_SET_PDEATHSIG``). The server is a child subreaper;
when a relay's socket closes before its child ended, the child's whole tree is SIGKILLed, and any
process re-parented to the server (left behind by an ended child) is killed at once — so no
process of a job outlives the job's own tree. Control messages: ``{"op": "status", "owner":
PID}`` (PID, a torchyard process, becomes an owner: the server drains once every owner is gone),
``{"op": "drain"}`` (stop serving, unlink the socket, release the lock, exit once no child is
active).
Single-threaded (it forks): one ``selectors`` loop.
"""

import argparse
import ctypes
import fcntl
import gc
import importlib
import importlib.machinery
import os
import selectors
import signal
import socket
import stat
import sys
import time
import traceback
from collections.abc import Iterator, Set
from contextlib import contextmanager
from dataclasses import dataclass, field

import psutil

from service.run.warm import BUSY_EXIT, LOCK_NAME, relay
from service.run.warm.child import become

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
REFILL_QUIET_S = 0.3  # refill only after this long without a hand-off: never compete with one
SWEEP_S = 0.5  # how often to look for processes re-parented to the server
# A peer that sends half a message must not stall the server (and every other job's hand-off).
PEER_TIMEOUT_S = 1.0
# A pool's probe holds the lock for microseconds; a live server holds it until it drains.
LOCK_WAIT_S = 0.5
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


def _prctl(option: int, value: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, value, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option})")


def import_time_mismatch(
    job_env: dict[str, str], own_env: dict[str, str], read: Set[str] = frozenset()
) -> str | None:
    """The first variable read at interpreter or torch import (or in ``read``: what the
    preload read) whose job value differs."""
    for name in sorted(set(job_env) | set(own_env)):
        if name in PASSED_THROUGH or name.startswith(RUN_TIME_PREFIXES):
            continue
        if not (name in read or name in IMPORT_TIME_NAMES
                or name.startswith(IMPORT_TIME_PREFIXES)):
            continue
        if job_env.get(name) != own_env.get(name):
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


@dataclass
class Active:
    conn: socket.socket | None  # None once the relay is gone (the child is being killed)
    job: str | None = None  # TORCHYARD_JOB_ID and RANK of what it runs (status only)
    rank: str | None = None


@dataclass
class Server:
    listener: socket.socket
    path: str
    pool: int
    sel: selectors.DefaultSelector = field(default_factory=selectors.DefaultSelector)
    idle: dict[int, socket.socket] = field(default_factory=dict)
    active: dict[int, Active] = field(default_factory=dict)
    served: int = 0
    refused: int = 0
    draining: bool = False
    last_handoff: float = 0.0
    started: float = field(default_factory=time.time)
    inode: int = 0
    wake_fds: tuple[int, ...] = ()
    # The torchyard processes using this server (one per `serve` worker); when all are gone, drain.
    owners: set[int] = field(default_factory=set)
    lock_fd: int | None = None  # held (flock) while serving: no second server at this socket

    # --- children -------------------------------------------------------------------------
    def fork_child(self) -> int:
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the idle child
            try:
                parent.close()
                self._child(child)
            except BaseException:  # noqa: BLE001  (before the hand-off: never the job's)
                traceback.print_exc()
            os._exit(70)
        child.close()
        self.idle[pid] = parent
        self.sel.register(parent, selectors.EVENT_READ, ("idle", pid))
        return pid

    def _child(self, channel: socket.socket) -> None:
        ppid = os.getppid()
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != ppid:
            os._exit(0)  # the server died before the death signal was armed
        # Nothing of the server's stays open in the job's process.
        for sock in [self.listener, *self.idle.values()]:
            sock.close()
        for active in self.active.values():
            if active.conn is not None:
                active.conn.close()
        self.sel.close()
        for fd in self.wake_fds:
            os.close(fd)
        if self.lock_fd is not None:  # the lock is the server's alone: not a job's to hold
            os.close(self.lock_fd)
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        signal.set_wakeup_fd(-1)
        received = relay.recv_message(channel)
        channel.close()
        if received is None:
            os._exit(0)  # the server let this idle child go
        message, fds = received
        become(message, fds)  # never returns: the job's end is the process's (child.finish)

    def handoff(self, conn: socket.socket, message: dict, fds: list[int]) -> None:
        why = self.refusal(message)
        if why is None and not self.idle:
            try:
                self.fork_child()  # slower than an idle one, still much faster than cold
            except OSError as exc:
                why = f"could not fork a warm process: {exc}"
        if why is not None:
            self.refused += 1
            for fd in fds:
                os.close(fd)
            self._reply(conn, {"ok": False, "reason": why})
            self._drop(conn)
            return
        pid, channel = self.idle.popitem()
        self.sel.unregister(channel)
        try:
            relay.send_message(channel, message, fds)
        finally:
            for fd in fds:
                os.close(fd)
            channel.close()
        env = message.get("env") or {}
        self.active[pid] = Active(conn, env.get("TORCHYARD_JOB_ID"), env.get("RANK"))
        self.sel.modify(conn, selectors.EVENT_READ, ("relay", pid))
        self.served += 1
        self.last_handoff = time.monotonic()
        self._reply(conn, {"ok": True, "pid": pid})

    def refusal(self, message: dict) -> str | None:
        if self.draining:
            return "the warm server is shutting down"
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            return "CUDA was initialised in the warm server (refusing to share it)"
        if message.get("executable") != os.path.realpath(sys.executable):
            return f"interpreter {message.get('executable')} is not the warm server's"
        theirs, ours = message.get("flags") or {}, relay.flags()
        differ = sorted(k for k in ours if theirs.get(k) != ours[k])
        if differ:
            return f"interpreter flags differ from the warm server's: {', '.join(differ)}"
        name = import_time_mismatch(dict(message.get("env") or {}), STARTED_ENV, READ_AT_IMPORT)
        if name is not None:
            return f"the job sets {name}, which is read when Python or torch starts"
        return shadowed(list(message.get("path") or []))

    def kill_tree(self, pid: int) -> None:
        try:
            proc = psutil.Process(pid)
            procs = [*proc.children(recursive=True), proc]
        except psutil.Error:
            return
        for p in procs:
            try:
                p.send_signal(signal.SIGKILL)
            except psutil.Error:
                pass

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid in self.idle:
                channel = self.idle.pop(pid)
                self.sel.unregister(channel)
                channel.close()
            active = self.active.pop(pid, None)
            if active is not None and active.conn is not None:
                self._reply(active.conn, {"exit": os.waitstatus_to_exitcode(status)})
                self._drop(active.conn)

    def sweep(self) -> None:
        """Kill what an ended child left behind (re-parented here: the server is a subreaper);
        drain when every torchyard process that owns this one is gone (no one would stop it)."""
        if self.owners:
            self.owners = {pid for pid in self.owners if psutil.pid_exists(pid)}
            if not self.owners:
                self.drain()
        known = set(self.idle) | set(self.active)
        try:
            children = psutil.Process().children()
        except psutil.Error:
            return
        for proc in children:
            if proc.pid not in known:
                self.kill_tree(proc.pid)

    # --- connections ----------------------------------------------------------------------
    def _reply(self, conn: socket.socket, obj: object) -> None:
        try:
            relay.send_message(conn, obj)
        except OSError:
            pass

    def _drop(self, conn: socket.socket) -> None:
        try:
            self.sel.unregister(conn)
        except (KeyError, ValueError):
            pass
        conn.close()

    def on_request(self, conn: socket.socket) -> None:
        try:
            received = relay.recv_message(conn)
        except (OSError, ValueError):
            received = None
        if received is None or not isinstance(received[0], dict):
            for fd in received[1] if received else []:
                os.close(fd)
            self._drop(conn)
            return
        message, fds = received
        op = message.get("op")
        if op == "run":
            self.handoff(conn, message, fds)
            return
        for fd in fds:
            os.close(fd)
        if op == "status":
            if isinstance(message.get("owner"), int) and not self.draining:
                self.owners.add(message["owner"])  # a (restarted) torchyard process adopts it
            self._reply(conn, self.status())
        elif op == "drain":
            self.drain()
            self._reply(conn, {"ok": True})
        self._drop(conn)

    def on_relay(self, conn: socket.socket, pid: int) -> None:
        try:
            received = relay.recv_message(conn)
        except (OSError, ValueError):
            received = None
        if received is None:  # the relay is gone: so must its process be
            self._drop(conn)
            if pid in self.active:
                self.active[pid].conn = None
            self.kill_tree(pid)
            return
        body = received[0]
        for fd in received[1]:
            os.close(fd)
        if isinstance(body, dict) and isinstance(body.get("signal"), int) and pid in self.active:
            try:
                os.kill(pid, int(body["signal"]))
            except (ProcessLookupError, ValueError):
                pass

    def status(self) -> dict[str, object]:
        torch = sys.modules.get("torch")
        return {
            "pid": os.getpid(),
            "idle": len(self.idle),
            "active": len(self.active),
            "pool": self.pool,
            "served": self.served,
            "refused": self.refused,
            "draining": self.draining,
            "cuda_initialized": bool(torch is not None and torch.cuda.is_initialized()),
            "preloaded": sorted(m for m in PRELOADED if m in sys.modules),
            "idle_pids": sorted(self.idle),
            "active_pids": sorted(self.active),
            # A warm process's /proc environ is the server's: this says which rank it became.
            "ranks": [{"pid": pid, "job_id": a.job, "rank": a.rank}
                      for pid, a in sorted(self.active.items())],
        }

    def drain(self) -> None:
        if self.draining:
            return
        self.draining = True
        try:
            if os.stat(self.path).st_ino == self.inode:
                os.unlink(self.path)  # never a successor's socket
        except OSError:
            pass
        self.sel.unregister(self.listener)
        self.listener.close()
        if self.lock_fd is not None:  # a successor may start now (it binds a fresh socket)
            os.close(self.lock_fd)
            self.lock_fd = None
        for channel in list(self.idle.values()):
            self.sel.unregister(channel)
            channel.close()  # the idle child sees end of stream and exits
        self.idle.clear()

    def serve(self) -> None:
        self.sel.register(self.listener, selectors.EVENT_READ, ("listen", 0))
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        self.wake_fds = (wake_r, wake_w)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.signal(signal.SIGTERM, lambda *_: self.drain())
        self.sel.register(wake_r, selectors.EVENT_READ, ("wake", 0))
        last_sweep = 0.0
        while not (self.draining and not self.active):
            quiet = time.monotonic() - self.last_handoff >= REFILL_QUIET_S
            wants_refill = not self.draining and len(self.idle) < self.pool
            timeout = (0 if quiet else REFILL_QUIET_S) if wants_refill else SWEEP_S
            events = self.sel.select(timeout)
            for key, _mask in events:
                kind, pid = key.data
                if kind == "listen":
                    conn, _ = self.listener.accept()
                    if relay.peer_uid(conn) != os.getuid():
                        conn.close()  # only our own user may hand work to this server
                        continue
                    conn.settimeout(PEER_TIMEOUT_S)
                    self.sel.register(conn, selectors.EVENT_READ, ("request", 0))
                    continue
                try:
                    if kind == "request":
                        self.on_request(key.fileobj)  # type: ignore[arg-type]
                    elif kind == "relay":
                        self.on_relay(key.fileobj, pid)  # type: ignore[arg-type]
                    elif kind == "wake":
                        os.read(wake_r, 4096)
                    # "idle": an idle child died; reap() below removes it
                except Exception:  # noqa: BLE001  (one bad peer must not end every warm rank)
                    traceback.print_exc()
            self.reap()
            now = time.monotonic()
            if now - last_sweep >= SWEEP_S:
                self.sweep()
                last_sweep = now
            if not events and wants_refill and quiet:
                self.fork_child()


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
    """Import what ranks would import first; a module that is missing is skipped."""
    with environ_reads() as read:
        for name in modules:
            try:
                importlib.import_module(name)
            except ImportError as exc:
                print(f"warm server: not preloading {name}: {exc}", file=sys.stderr, flush=True)
                continue
            PRELOADED.append(name)
    READ_AT_IMPORT.update(read)


class Busy(Exception):
    """Another warm server holds the lock of this socket."""


def claim(path: str) -> int:
    """The lock that makes this the only warm server at ``path`` (``flock`` on ``server.lock``
    in the socket's private directory, which is created if missing); its descriptor, holding
    this server's pid. Raises :class:`Busy` when another server holds it, ``relay.Untrusted``
    when the directory is not private."""
    directory = os.path.dirname(path)
    relay.make_private_dir(directory)
    dir_fd = relay.private_dir(directory)
    try:
        fd = os.open(LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                     dir_fd=dir_fd)
    finally:
        os.close(dir_fd)
    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() >= deadline:
                os.close(fd)
                raise Busy(f"another warm server serves {path}") from None
            time.sleep(0.02)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def listen(path: str) -> tuple[socket.socket, int]:
    """A socket only this user can reach (0600 in a private directory), bound through the
    checked directory (``relay.via_fd``). Call with the lock held (:func:`claim`): whatever
    socket is there then is a dead server's."""
    directory, name = os.path.split(path)
    dir_fd = relay.private_dir(directory)
    try:
        try:
            if stat.S_ISSOCK(os.lstat(name, dir_fd=dir_fd).st_mode):
                os.unlink(name, dir_fd=dir_fd)  # a predecessor's, left by a crash
        except FileNotFoundError:
            pass
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            sock.bind(relay.via_fd(dir_fd, name))
        finally:
            os.umask(old)
        sock.listen(64)
        return sock, os.stat(name, dir_fd=dir_fd).st_ino
    finally:
        os.close(dir_fd)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m service.run.warm.server")
    parser.add_argument("--socket", required=True)
    parser.add_argument("--pool", type=int, default=4)
    parser.add_argument("--preload", default="torch")
    parser.add_argument("--owner", type=int, default=None, help="drain when this pid is gone")
    args = parser.parse_args(argv)
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    started = time.time()
    try:  # before importing torch: a second server costs nothing
        lock_fd = claim(args.socket)
    except Busy as exc:
        print(f"warm server: {exc}; exiting", flush=True)
        raise SystemExit(BUSY_EXIT) from None
    except relay.Untrusted as exc:
        raise SystemExit(f"warm server: not serving: {exc}") from None
    preload([m for m in args.preload.split(",") if m])
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        raise SystemExit("warm server: a preloaded module initialised CUDA; not serving")
    # What the preload made is never collected: the children's garbage collector leaves those
    # pages shared (copy-on-write) and their exit walks only what the job made (child.finish).
    gc.freeze()
    listener, inode = listen(args.socket)
    server = Server(listener=listener, path=args.socket, pool=args.pool, inode=inode,
                    owners={args.owner} if args.owner is not None else set(), lock_fd=lock_fd)
    for _ in range(args.pool):
        server.fork_child()
    print(f"warm server {os.getpid()}: ready in {time.time() - started:.2f} s, "
          f"preloaded {','.join(PRELOADED)}, pool {args.pool}", flush=True)
    server.serve()


if __name__ == "__main__":
    main()
