"""The warm server: ``python -u -m service.run.warm.server --socket PATH --pool N [--preload M,...]``.

A per-host fork server that has imported torch (and ``--preload``: torchvision, the built-in trainer's
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
(``service.run.warm.preload``: every variable the preload's Python code read, recorded while
preloading, and the families C code reads at start: ``TORCH*``/``PYTORCH_*``, ``LD_*``,
``PYTHON*`` but the path ones, ``OMP_*`` but ``OMP_NUM_THREADS``, ``MKL_*``, ``KMP_*``,
``GOMP_*``, ``OPENBLAS_*``, ``MALLOC_*``, ``GLIBC_TUNABLES``).

One per socket: the server holds an exclusive ``flock`` on ``server.lock`` next to its socket
from before it imports anything until it drains; a second server for the same socket exits at
once with ``BUSY_EXIT`` and never touches the first one's socket (``torchyard serve --workers N``
has N pools and one warm server). The socket's directory must be private (this user's, 0700, not
a symlink: ``relay.private_dir``); peers of another uid (but root) are refused (``SO_PEERCRED``): the
lock and the socket are ``service.run.warm.listen``'s.

Lifetime: children die with the server (``PR_SET_PDEATHSIG``). The server is a child subreaper;
when a relay's socket closes before its child ended, the child's whole tree is SIGKILLed, and any
process re-parented to the server (left behind by an ended child) is killed at once — so no
process of a job outlives the job's own tree. Control messages: ``{"op": "status", "owner":
PID}`` (PID, a torchyard process, becomes an owner: the server drains once every owner is gone),
``{"op": "release", "owner": PID}`` (PID stops owning it: a torchyard process stopping; the
server drains when that was the last owner), ``{"op": "drain"}`` (stop serving, unlink the
socket, release the lock, exit once no child is active).
Process trees (the death signal, the subreaper, killing a tree) are ``service.run.proctree``'s.
Single-threaded (it forks): one ``selectors`` loop.
"""

import argparse
import gc
import os
import selectors
import signal
import socket
import sys
import time
import traceback
from dataclasses import dataclass, field

from service.run import fastexit, proctree
from service.run.warm import BUSY_EXIT, listen, preload, relay
from service.run.warm.child import become

# Re-exported for the tests and older imports: the checks live in service.run.warm.preload.
from service.run.warm.preload import environ_reads as environ_reads
from service.run.warm.preload import import_time_mismatch as import_time_mismatch

REFILL_QUIET_S = 0.3  # refill only after this long without a hand-off: never compete with one
SWEEP_S = 0.5  # how often to look for processes re-parented to the server


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
    # The torchyard processes using this server (one per API process of `serve`); when all are gone, drain.
    owners: set[int] = field(default_factory=set)
    lock_fd: int | None = None  # held (flock) while serving: no second server at this socket
    # No rank ran since a sweep found no stray child: nothing can be re-parented here until the
    # next hand-off, so the sweep skips its scan of every process (~2-6 ms, twice a second).
    settled: bool = False
    pid: int = field(default_factory=os.getpid)

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
        if not proctree.die_with_parent(signal.SIGKILL, self.pid):
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
        return preload.refusal(message)

    def reap(self) -> None:
        proctree.reap_zombies(self._ended)

    def _ended(self, pid: int, status: int) -> None:
        if pid in self.idle:
            channel = self.idle.pop(pid)
            self.sel.unregister(channel)
            channel.close()
        active = self.active.pop(pid, None)
        if active is not None:
            self.settled = False  # what the rank started is re-parented here now
        if active is not None and active.conn is not None:
            self._reply(active.conn, {"exit": os.waitstatus_to_exitcode(status)})
            self._drop(active.conn)

    def sweep(self) -> None:
        """Kill what an ended child left behind (re-parented here: the server is a subreaper);
        drain when every torchyard process that owns this one is gone (no one would stop it).
        Skips the scan while ``settled``: a rank's end (``_ended``) unsettles it, even one that
        started and ended between two sweeps."""
        if self.owners:
            self.owners = {pid for pid in self.owners if proctree.exists(pid)}
            if not self.owners:
                self.drain()
        if self.settled and not self.active:
            return
        known = set(self.idle) | set(self.active)
        strays = [pid for pid in proctree.children() if pid not in known]
        for pid in strays:
            proctree.kill_tree(pid)
        self.settled = not strays and not self.active

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
        elif op == "release":
            if isinstance(message.get("owner"), int):
                self.owners.discard(message["owner"])
            if not self.owners:
                self.drain()
            self._reply(conn, {"ok": True, "draining": self.draining})
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
            proctree.kill_tree(pid)
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
            "owners": sorted(self.owners),  # the torchyard processes it serves (``status``)
            "cuda_initialized": bool(torch is not None and torch.cuda.is_initialized()),
            "preloaded": sorted(m for m in preload.PRELOADED if m in sys.modules),
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
                    if (conn := listen.accept(self.listener)) is not None:
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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m service.run.warm.server")
    parser.add_argument("--socket", required=True)
    parser.add_argument("--pool", type=int, default=4)
    parser.add_argument("--preload", default="torch")
    parser.add_argument("--owner", type=int, default=None, help="drain when this pid is gone")
    args = parser.parse_args(argv)
    if not proctree.become_subreaper():
        raise SystemExit("warm server: cannot be a child subreaper (no prctl); not serving")
    started = time.time()
    try:  # before importing torch: a second server costs nothing
        lock_fd = listen.claim(args.socket)
    except listen.Busy as exc:
        print(f"warm server: {exc}; exiting", flush=True)
        raise SystemExit(BUSY_EXIT) from None
    except relay.Untrusted as exc:
        raise SystemExit(f"warm server: not serving: {exc}") from None
    preload.preload([m for m in args.preload.split(",") if m])
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        raise SystemExit("warm server: a preloaded module initialised CUDA; not serving")
    # What the preload made is never collected: the children's garbage collector leaves those
    # pages shared (copy-on-write) and their exit walks only what the job made (child.finish).
    gc.freeze()
    listener, inode = listen.listen(args.socket)
    server = Server(listener=listener, path=args.socket, pool=args.pool, inode=inode,
                    owners={args.owner} if args.owner is not None else set(), lock_fd=lock_fd)
    for _ in range(args.pool):
        server.fork_child()
    print(f"warm server {os.getpid()}: ready in {time.time() - started:.2f} s, "
          f"preloaded {','.join(preload.PRELOADED)}, pool {args.pool}", flush=True)
    server.serve()
    # Drained: end without tearing the preloaded torch down (~1 CPU s, and as long again before
    # the server's stop is over), as a warm rank ends.
    fastexit.finish(0)


if __name__ == "__main__":
    main()
