"""The torchyard server's side of warm ranks: start, watch, refill and report the warm server.

:class:`WarmPool` runs one background thread that keeps a warm server
(``python -u -m service.run.warm.server``) alive on this host: started (or, after a torchyard restart,
adopted) in a session of its own, asked for its status every ``CHECK_S``, measured (the server's RSS
plus its idle children's own pages) and replaced when it died, grew past its memory budget or
stopped answering (``SILENCE_PATIENCE_S`` without an answer, once it had answered: until then
jobs start cold and its running ranks go on). Nothing here blocks a launch:
:meth:`socket_for_launch` returns the socket only while the last check found the server ready
(else None: the job starts cold). :meth:`close`
gives this process's ownership back; with no owner left the server drains: it stops serving and
exits once its running ranks ended, so jobs outlive the torchyard server as they do without warm
ranks. Never imports torch.

Where: ``DIR/server.sock``, ``DIR`` being ``TORCHYARD_WARM_DIR`` or ``HOME/warm``, whatever its
length (connections go through the checked directory, ``relay.connect``). The pool creates
``DIR`` (0700) and checks it before every use: one that is not this user's own private directory
(another uid's, a symlink, group or other access) is never used — the pool reports ``broken`` and
every job starts cold, saying why.

One warm server per directory: with ``torchyard serve --workers N`` each API process has a pool, and
they share one server; so do servers of other homes that name the same ``TORCHYARD_WARM_DIR``.
A pool starts a server only when none answers and none holds the server's lock (``server.lock``,
see ``service.run.warm.listen.claim``); a server that finds the lock held exits at once
(``BUSY_EXIT``) without touching the socket. Every pool asks the one server's status (each
API process becomes an owner: the server drains once all are gone) and hands its socket out;
:meth:`WarmPool.close` gives this process's ownership back (``release``), so the server drains
when its last owner stops, not when the first one does.
"""

import fcntl
import logging
import os
import signal
import stat
import subprocess
import threading
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import psutil

from service.executor.asuser import (
    USER_POOL_IDLE_S,
    UserPools,
    credentials,
    make_user_dir,
    user_warm_dir,
)
from service.executor.base import WarmStatus
from service.run.warm import BUSY_EXIT, LOCK_NAME, relay
from service.run.warm.relay import ask  # the one control request (the attempt loop's too)
from torchyard_contract import runwrite
from torchyard_contract.childenv import environ_for_children
from torchyard_contract.launch import RunAs

logger = logging.getLogger(__name__)

CHECK_S = 1.0  # status poll of the warm server
MEMORY_CHECK_S = 10.0  # USS reads /proc/PID/smaps: not every poll
MEMORY_RECHECK_S = 60.0  # ... and of a pool that has not changed, only this often
STARTUP_TIMEOUT_S = 300.0  # importing torch on a loaded machine; after this it counts as hung
CLAIM_TIMEOUT_S = 30.0  # from spawn to holding the server's lock (before it imports torch)
# A server that answered and then falls silent while it holds its lock is alive, and its ranks
# run on: a loaded host can delay one reply past the 2 s a check waits. Killing it would kill
# every warm rank on the host (PDEATHSIG), so it is only after this long without an answer.
SILENCE_PATIENCE_S = 30.0
# Variables torch reads when the server imports it; the server must not inherit the server's.
NOT_INHERITED = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUDA_VISIBLE_DEVICES")


def socket_path(home: Path, directory: Path | None = None) -> str:
    """``DIRECTORY/server.sock``, by default ``HOME/warm/server.sock``: in the service's own
    home, whatever its length (no fallback anywhere another user could create first)."""
    return str((directory or home / "warm").resolve() / "server.sock")


def lock_holder(directory: str) -> int | None:
    """The pid of the warm server holding the lock in ``directory`` (0 when it has not written
    it yet); None when no server holds it (or the lock is no regular file: a job user's warm
    directory is that user's to fill)."""
    try:
        fd = os.open(os.path.join(directory, LOCK_NAME),
                     os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except (FileNotFoundError, OSError):
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            text = os.pread(fd, 32, 0).decode(errors="replace").strip()
            return int(text) if text.isdigit() else 0
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def build_server_command(
    python: str, path: str, size: int, preload: list[str], owner: int
) -> list[str]:
    """The warm server's argv; pure."""
    return [python, "-u", "-m", "service.run.warm.server", "--socket", path, "--pool", str(size),
            "--preload", ",".join(preload), "--owner", str(owner)]


def pool_memory(server: int, idle: list[int]) -> int:
    """What the pool holds resident: the server's RSS plus each idle child's own pages (USS;
    the rest it shares copy-on-write with the server). Not PSS: PSS splits the pages of torch's
    libraries with every other torch process on the host, so it would shrink as ranks start."""
    try:
        total = psutil.Process(server).memory_info().rss
    except psutil.Error:
        return 0
    for pid in idle:
        try:
            total += psutil.Process(pid).memory_full_info().uss
        except (psutil.Error, AttributeError):
            continue
    return total


class WarmPool:
    def __init__(
        self, *, python: str, home: Path, size: int, preload: list[str], max_memory_mib: int,
        environ: Mapping[str, str] | None = None, directory: Path | None = None,
        run_as: RunAs | None = None,
    ) -> None:
        self.python, self.size, self.preload = python, size, preload
        self.home = home
        self.max_memory_mib = max_memory_mib
        # A job user's pool (``service.executor.asuser``): its server runs as that user, in
        # HOME/warm-users/<uid>, and retires when unused; None = the server's own pool, which
        # keeps the users' pools.
        self.run_as = run_as
        self.users = UserPools(self._user_pool) if run_as is None else None
        self.retired = False
        self._last_launch = time.monotonic()
        if run_as is not None:
            directory = user_warm_dir(home, run_as)
        self.path = socket_path(home, directory)
        self.directory = os.path.dirname(self.path)
        self.memory_limit = max_memory_mib * 2**20
        self._environ = dict(os.environ if environ is None else environ)
        self._status = WarmStatus("starting", size, memory_limit_bytes=self.memory_limit)
        self._proc: subprocess.Popen[bytes] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_memory = 0.0
        self._last_pool: tuple[int, int, tuple[int, ...]] | None = None
        self._restarts = 0
        self._spawned_at = 0.0
        self._answered = False  # the server this pool started has answered
        self._held_since: float | None = None  # another's server holds the lock, silent
        self._has_answered = False  # a warm server has answered this pool
        self._silent_since: float | None = None  # the first check it missed since (monotonic)

    # --- what others read ------------------------------------------------------------------
    def status(self) -> WarmStatus:
        return self._status

    def socket_for_launch(self, run_as: RunAs | None = None) -> tuple[str | None, str]:
        """(the socket a job's attempt loop hands its relays, '') while the server is ready, else
        (None, why not): the job starts cold at once, never waiting for the pool. ``run_as``:
        a job of that Unix user, served by that user's own warm server (``UserPools``)."""
        if run_as is not None:
            if self.users is None:
                return None, "a job user's pool serves no other user"
            return self.users.socket_for_launch(run_as)
        state = self._status.state
        if state == "ready":
            return self.path, ""
        if self._status.reason:
            return None, self._status.reason
        if state == "starting" and self._status.restarts == 0:
            return None, "the warm pool is starting (importing torch)"
        return None, "the warm server is being replaced"

    def touch(self) -> None:
        """A job was launched with this pool's socket (or was about to be): not idle."""
        self._last_launch = time.monotonic()

    def _user(self) -> int | None:
        return self.run_as.uid if self.run_as is not None else None

    def _ask(self, message: dict) -> dict | None:
        return ask(self.path, message, uid=self._user())

    def _user_pool(self, run_as: RunAs) -> "WarmPool":
        return WarmPool(python=self.python, home=self.home, size=self.size, preload=self.preload,
                        max_memory_mib=self.max_memory_mib, environ=self._environ, run_as=run_as)

    # --- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="torchyard-warm", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop watching and give this process's ownership back: the server drains (exits once
        the ranks it runs have ended) when no other owner is left."""
        self._stop.set()
        if self.users is not None:
            self.users.close()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)
        # A server from before ``release`` drops the request unanswered: it is asked to drain,
        # as it was then.
        if self._ask({"op": "release", "owner": os.getpid()}) is None \
                and self._ask({"op": "drain"}) is None \
                and self._proc is not None and not self._answered:
            self._detach(kill=True)  # never answered: still importing torch, serving no one
        self._detach(kill=False)  # else it drains, or serves the owners still left

    def _run(self) -> None:
        while not self._stop.is_set():
            if self._unused():
                logger.info("warm pool of %s: unused for %.0f s; its server drains",
                            self.run_as.user if self.run_as else "?", USER_POOL_IDLE_S)
                self.retired = True
                self.close()
                return
            try:
                self._check()
            except Exception:
                logger.exception("warm pool: check failed")
            self._stop.wait(CHECK_S)

    def _unused(self) -> bool:
        """A job user's pool no job was launched with for ``USER_POOL_IDLE_S``, running none."""
        return (self.run_as is not None and self._status.active == 0
                and time.monotonic() - self._last_launch > USER_POOL_IDLE_S)

    def _check(self) -> None:
        try:
            if self.run_as is not None:
                make_user_dir(self.directory, self.run_as)
            else:
                relay.make_private_dir(self.directory)
        except OSError as exc:
            why = f"the warm socket's directory is unsafe: {exc}"
            if why != self._status.reason:
                logger.error("warm pool: %s; warm ranks are off until it is fixed", why)
            self._status = replace(self._status, state="broken", idle=0, active=0, reason=why)
            return
        reply = self._ask({"op": "status", "owner": os.getpid()})
        if reply is None:
            self._no_answer()
            return
        self._held_since = None
        self._has_answered, self._silent_since = True, None
        if self._proc is not None and int(reply["pid"]) == self._proc.pid:
            self._answered = True
        now = time.monotonic()
        memory = self._status.memory_bytes
        idle_pids = [int(p) for p in reply.get("idle_pids", [])]
        # An idle pool's memory does not move: read it again only after a hand-off or a new
        # process (or every MEMORY_RECHECK_S all the same).
        pool = (int(reply["pid"]), int(reply["served"]), tuple(sorted(idle_pids)))
        since = now - self._last_memory
        if self._status.state != "ready" or since >= MEMORY_RECHECK_S or (
                since >= MEMORY_CHECK_S and pool != self._last_pool):
            memory = pool_memory(int(reply["pid"]), idle_pids)
            self._last_memory, self._last_pool = now, pool
        self._status = WarmStatus(
            state="ready", pool_size=self.size, idle=int(reply["idle"]),
            active=int(reply["active"]), served=int(reply["served"]),
            refused=int(reply["refused"]), memory_bytes=memory,
            memory_limit_bytes=self.memory_limit, pid=int(reply["pid"]),
            cuda_initialized=bool(reply["cuda_initialized"]), restarts=self._restarts,
        )
        if self.memory_limit and memory > self.memory_limit:
            logger.warning("warm pool: %d MiB over its %d MiB budget; replacing the server",
                           memory // 2**20, self.memory_limit // 2**20)
            # It unlinks its socket and exits once its running ranks end; the next check
            # finds no server and starts a fresh one.
            self._ask({"op": "drain"})
            self._detach(kill=False)
            self._status = replace(self._status, state="starting")

    def _no_answer(self) -> None:
        now = time.monotonic()
        holder = lock_holder(self.directory)  # the pid of the one server serving this socket
        proc = self._proc
        alive = proc is not None and proc.poll() is None
        # Silence counted from the first missed check, not from the last answer: a pool whose
        # own process was stopped for a while has not heard a server fall silent.
        self._silent_since = self._silent_since or now
        if holder and self._has_answered and now - self._silent_since < SILENCE_PATIENCE_S:
            # Held, so alive: slow, not gone. New jobs start cold until it answers again.
            why = f"the warm server {holder} does not answer"
            if self._status.state == "ready":
                logger.warning("warm pool: %s; jobs start cold until it does (it is replaced "
                               "after %.0f s without an answer)", why, SILENCE_PATIENCE_S)
            self._status = replace(self._status, state="starting", idle=0, active=0, reason=why)
            return
        lost = self._status.state == "ready" or (
            proc is not None and not alive and proc.returncode != BUSY_EXIT)
        if lost:
            logger.warning("warm pool: the warm server is gone or does not answer")
            self._restarts += 1
        self._status = replace(self._status, state="starting", idle=0, active=0,
                               restarts=self._restarts, reason="")
        if holder == 0:
            return  # a server took the lock this instant and has not written its pid yet
        if proc is not None and alive and holder == proc.pid:
            if not self._answered and now - self._spawned_at < STARTUP_TIMEOUT_S:
                return  # still importing torch: not listening yet
            logger.warning("warm pool: the warm server does not answer; replacing it")
            self._detach(kill=True)  # the lock goes with it: the next check starts another
            self._restarts += 0 if lost else 1
            return
        if proc is not None and alive and holder is None and not self._answered \
                and now - self._spawned_at < CLAIM_TIMEOUT_S:
            return  # still starting Python, about to take the lock
        if proc is not None:
            # Draining (it released the lock), or it found another server and is exiting.
            self._detach(kill=False)
        if holder is None:
            self._held_since = None
            self._spawn()
            return
        # Another API process's pool started it and it is importing torch; if it hangs, it is
        # killed after the same patience as a server of our own, and replaced.
        self._held_since = self._held_since or now
        if now - self._held_since >= STARTUP_TIMEOUT_S and _is_warm_server(holder, self._user()):
            logger.warning("warm pool: warm server %s never answered; replacing it", holder)
            os.kill(holder, signal.SIGKILL)
            self._held_since = None

    def _detach(self, *, kill: bool) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if kill:
            proc.kill()
        threading.Thread(target=proc.wait, daemon=True).start()  # reap, never block

    def _spawn(self) -> None:
        """The warm server, as this pool's user (``run_as``: with that user's login variables,
        as its jobs have them, so their import-time variables match), its log confined to its
        directory (a job user's own: it may hold anything)."""
        env = environ_for_children(self._environ)
        for name in NOT_INHERITED:
            env.pop(name, None)
        if self.run_as is not None:
            env.update(self.run_as.login_env())
        log_dir = Path(self.directory)  # private: checked by _check just now
        log = runwrite.open_append(log_dir / "server.log")
        try:
            self._proc = subprocess.Popen(
                build_server_command(self.python, self.path, self.size, self.preload, os.getpid()),
                env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True, cwd=log_dir,
                **credentials(self.run_as),  # type: ignore[arg-type]
            )
        finally:
            os.close(log)
        self._spawned_at = time.monotonic()
        self._answered = False
        logger.info("warm pool: warm server %s starting (%s)", self._proc.pid, self.path)


def _is_warm_server(pid: int, uid: int | None = None) -> bool:
    """``pid`` is a warm server of this user (``uid``: of that one, a job user's pool, whose
    lock file that user can write any pid into), not a process that reused a dead one's pid."""
    try:
        proc = psutil.Process(pid)
        owner = os.getuid() if uid is None else uid
        return proc.uids().real == owner and "service.run.warm.server" in proc.cmdline()
    except psutil.Error:
        return False
