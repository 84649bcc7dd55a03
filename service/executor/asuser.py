"""Processes of a job's own Unix user (``RunAs``: its team's), started by a server running as root.

:func:`credentials` are ``Popen``'s arguments for such a process. :class:`UserPools` keeps one
warm server per such user (docs/warm-ranks.md, "Jobs that run as their team's user"), each
running as that user in ``HOME/warm-users/<uid>/`` (:func:`user_warm_dir`, made by
:func:`make_user_dir`): a warm process is forked from a server of the job's own user, so no
process that ever held root's credentials, or another team's hand-off (its environment: secrets,
the job token), runs a job's code. Started at the user's first job (which starts cold, saying the
pool is starting), retired after ``USER_POOL_IDLE_S`` without a launch and without a running
rank (its server drains), so an idle team holds no memory.
"""

import os
import subprocess
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Protocol

import service
from service.run.warm import relay
from torchyard_contract.launch import RunAs

USER_POOL_IDLE_S = 900.0  # a user's warm server unused this long (and running nothing) drains
USERS_DIR_MODE = 0o711  # everyone may pass through to their own directory; no one may list it
START_CHECK_TIMEOUT_S = 60.0  # an import of the attempt loop on a loaded host, with room


def credentials(run_as: RunAs | None) -> dict[str, object]:
    """``Popen``'s arguments that start a process as ``run_as``: in the child, before ``exec``,
    supplementary groups dropped (``setgroups([])``), then the primary group, then the user
    (``setregid``, ``setreuid``: real, effective and saved ids alike, so nothing can switch
    back). Nothing for None: the server's own user."""
    if run_as is None:
        return {}
    return {"user": run_as.uid, "group": run_as.gid, "extra_groups": []}


def why_user_cannot_start(python: str, run_as: RunAs, env: Mapping[str, str]) -> str | None:
    """Why ``run_as`` could not start a job's attempt loop with ``python`` (None: it can): that
    user imports ``service.run.attemptloop`` with ``env``, as the attempt loop would. This tells
    what mode bits alone cannot: an interpreter, a venv's ``.pth`` files or an editable checkout
    below a directory that user cannot enter (a 0700 home, a ``mktemp -d`` directory), where the
    job would otherwise end with nothing but its attempt-loop.log to say why."""
    try:
        done = subprocess.run(
            [python, "-c", "import service.run.attemptloop"], cwd="/", env=dict(env),
            stdin=subprocess.DEVNULL, capture_output=True, timeout=START_CHECK_TIMEOUT_S,
            **credentials(run_as),  # type: ignore[arg-type]
        )
    except subprocess.TimeoutExpired:
        return (f"{run_as.user} could not import torchyard's attempt loop with {python} "
                f"within {START_CHECK_TIMEOUT_S:.0f} s")
    except OSError as exc:
        return f"{run_as.user} cannot run {python}: {exc.strerror}{_closed_to(run_as, python)}"
    if done.returncode == 0:
        return None
    lines = done.stderr.decode(errors="replace").strip().splitlines() or [f"exit {done.returncode}"]
    return (f"{run_as.user} cannot import torchyard's attempt loop with {python}: "
            f"{lines[-1][:300]}{_closed_to(run_as, python)}")


def _closed_to(run_as: RunAs, python: str) -> str:
    """``; why``: the first directory above the interpreter (as given, then resolved: a venv's
    links elsewhere) or torchyard's checkout that ``run_as`` cannot enter; "" when none."""
    for path in dict.fromkeys((os.path.abspath(python), os.path.realpath(python),
                               os.path.dirname(service.__file__))):
        if (why := run_as.cannot_enter(Path(path).parent)) is not None:
            return f"; {why}"
    return ""


def user_warm_dir(home: Path, run_as: RunAs) -> Path:
    """Where ``run_as``'s warm server keeps its socket, lock and log (by uid: no name to escape)."""
    return home.resolve() / "warm-users" / str(run_as.uid)


def make_user_dir(directory: str, run_as: RunAs) -> None:
    """Create ``directory`` for ``run_as`` (owned by the user, mode 0700) inside a parent that is
    the server's own (mode ``USERS_DIR_MODE``); check both. Raises ``relay.Untrusted`` when the
    parent is not the server's, or the directory not the user's private one (never repaired:
    the user's jobs then start cold, saying why)."""
    parent, name = os.path.split(directory)
    try:
        os.mkdir(parent, USERS_DIR_MODE)
        os.chmod(parent, USERS_DIR_MODE)  # whatever the umask
    except FileExistsError:
        pass
    parent_fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        st = os.fstat(parent_fd)
        if st.st_uid != os.geteuid() or st.st_mode & 0o022:
            raise relay.Untrusted(f"{parent} is not this server's own directory")
        try:
            os.mkdir(name, 0o700, dir_fd=parent_fd)
            os.chown(name, run_as.uid, run_as.gid, dir_fd=parent_fd, follow_symlinks=False)
        except FileExistsError:
            pass
    finally:
        os.close(parent_fd)
    os.close(relay.private_dir(directory, run_as.uid))


class Pool(Protocol):
    """What :class:`UserPools` uses of a ``service.executor.warmpool.WarmPool``."""

    retired: bool  # it drained for want of use: the next launch makes a new one

    def start(self) -> None: ...

    def touch(self) -> None: ...

    def socket_for_launch(self) -> tuple[str | None, str]: ...

    def close(self) -> None: ...


class UserPools:
    """The warm pools of jobs' Unix users, by uid; ``make`` builds (unstarted) the pool of one."""

    def __init__(self, make: Callable[[RunAs], Pool]) -> None:
        self._make = make
        self._pools: dict[int, Pool] = {}
        self._lock = threading.Lock()
        self._closed = False

    def socket_for_launch(self, run_as: RunAs) -> tuple[str | None, str]:
        """As ``WarmPool.socket_for_launch``, from ``run_as``'s own pool (started now when it
        has none: this job starts cold)."""
        with self._lock:
            if self._closed:
                return None, "the server is stopping"
            pool = self._pools.get(run_as.uid)
            if pool is None or pool.retired:
                pool = self._pools[run_as.uid] = self._make(run_as)
                pool.start()
        pool.touch()
        return pool.socket_for_launch()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            pool.close()
