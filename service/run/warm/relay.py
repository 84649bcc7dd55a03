"""The rank program of a warm start: ``python RELAY SOCKET <python args>`` (torchrun runs it).

``<python args>`` is what ``python`` would have been given: ``-m MODULE ARGS``, ``-c CODE ARGS``
or ``SCRIPT ARGS``. The relay asks the host's warm server (``service.run.warm.server``, a fork
server that has imported torch) over the Unix socket ``SOCKET`` for a process that becomes this
program, passing its stdin/stdout/stderr (``SCM_RIGHTS``), environment, working directory,
``sys.path`` (what the job's own interpreter would have: the relay's, with the script's
directory or the working directory in front as plain ``python`` puts it) and flags. Then it:

* forwards SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 to that process;
* exits as it exited: the same code, or killed by the same signal (so torchrun's failure summary,
  error files and exit codes read as for a cold rank);
* when the relay itself is killed (SIGKILL) the server sees its socket close and kills the warm
  process and everything under it, so nothing of a job outlives the job's own process tree.

Without a usable server (no socket, refused, broken) the relay execs the cold command — the same
interpreter, flags and args — after one line on stderr saying why, so a job always starts.

Trust (:func:`connect`): nothing is sent until the socket's directory is proven private — a
directory, not a symlink, owned by this user, mode 0700 (checked on the directory the connection
then goes through, ``/proc/self/fd/N/server.sock``, so it cannot be swapped in between; that also
lifts ``sun_path``'s 108-byte limit) — and the process listening on it runs as this user
(``SO_PEERCRED``). Another local user can then neither pose as the warm server nor read a rank's
environment (its secrets and job token) or stdio. The torchyard server's pool and the warm server
make the same checks (docs/security.md).

Imports only the standard library and nothing of ``service`` (it runs by path, with the job's
``sys.path``). This module also owns the wire format both sides use: a message is a 4-byte
big-endian length, then that much JSON; file descriptors ride on the length's ``sendmsg``.
"""

import errno
import json
import os
import signal
import socket
import struct
import sys

FORWARDED_SIGNALS = (
    signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
)
MAX_FDS = 8
MAX_MESSAGE_BYTES = 64 * 2**20
CONNECT_TIMEOUT_S = 2.0  # a server that does not answer the hand-off in this long: go cold
# Interpreter flags that change how code runs; a warm process has the server's, so a relay whose
# interpreter differs in any of them starts cold. (-u is handled: stdio is rebuilt to match.)
FLAGS = (
    "debug", "inspect", "optimize", "dont_write_bytecode", "no_user_site", "no_site",
    "ignore_environment", "verbose", "bytes_warning", "quiet", "hash_randomization", "isolated",
    "dev_mode", "utf8_mode", "safe_path",
)
# ... except these, whose one effect the relay reproduces: safe_path (-P, PYTHONSAFEPATH, which a
# script directory's ``-m`` module job runs with) only keeps the working directory or script
# directory off ``sys.path``, and the relay sends the ``sys.path`` its job would start with
# (:func:`job_sys_path`). Still sent (``flags``): a warm server from before this compares it.
REPRODUCED_FLAGS = frozenset({"safe_path"})


class Untrusted(OSError):
    """The socket's directory or the process behind it is not this user's own."""


def private_dir(path: str, uid: int | None = None) -> int:
    """An open descriptor of directory ``path`` once it is proven private: not a symlink, a
    directory, owned by this user (``uid``: by that one; a root pool checks a job user's warm
    directory), no access for group or others. Raises :class:`Untrusted` (or ``OSError`` when
    it cannot be opened, e.g. it does not exist)."""
    owner = os.getuid() if uid is None else uid
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise Untrusted(f"{path} is not a directory (a symlink?)") from None
        raise
    st = os.fstat(fd)
    why = None
    if st.st_uid != owner:
        why = f"{path} is owned by uid {st.st_uid}, not by {_whose(uid)} (uid {owner})"
    elif st.st_mode & 0o077:
        why = f"{path} has mode {st.st_mode & 0o777:04o}, not 0700"
    if why is not None:
        os.close(fd)
        raise Untrusted(why)
    return fd


def _whose(uid: int | None) -> str:
    return "this user" if uid is None else "the job's user"


def make_private_dir(path: str) -> None:
    """Create ``path`` (mode 0700) if it is missing, then check it (:func:`private_dir`).
    An existing directory is never repaired: one that is not private raises :class:`Untrusted`."""
    try:
        os.mkdir(path, 0o700)
        os.chmod(path, 0o700)  # whatever the umask: created just now, by us
    except FileExistsError:
        pass
    os.close(private_dir(path))


def via_fd(dir_fd: int, name: str) -> str:
    """The address of ``name`` inside the open directory ``dir_fd``: short whatever the
    directory's path, and always that very directory."""
    return f"/proc/self/fd/{dir_fd}/{name}"


def peer_uid(conn: socket.socket) -> int:
    """The uid of the process at the other end of a Unix socket (``SO_PEERCRED``)."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


def connect(path: str, timeout_s: float, uid: int | None = None) -> socket.socket:
    """A connection to the warm server listening at ``path``, checked before anything is sent:
    ``path``'s directory is private (:func:`private_dir`) and the listening process is this
    user's (``SO_PEERCRED``; ``uid``: that user's). Raises :class:`Untrusted`, or ``OSError``
    (no server)."""
    owner = os.getuid() if uid is None else uid
    directory, name = os.path.split(path)
    dir_fd = private_dir(directory, owner)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.settimeout(timeout_s)
        conn.connect(via_fd(dir_fd, name))
        peer = peer_uid(conn)
        if peer != owner:
            raise Untrusted(f"{path} is served by uid {peer}, not by {_whose(uid)} (uid {owner})")
    except BaseException:
        conn.close()
        raise
    finally:
        os.close(dir_fd)
    return conn


def send_message(sock: socket.socket, obj: object, fds: list[int] | tuple[int, ...] = ()) -> None:
    data = json.dumps(obj).encode()
    header = struct.pack(">I", len(data))
    if fds:
        socket.send_fds(sock, [header], list(fds))
    else:
        sock.sendall(header)
    sock.sendall(data)


def recv_message(sock: socket.socket) -> tuple[object, list[int]] | None:
    """(message, fds), or None at end of stream."""
    header, fds, _flags, _addr = socket.recv_fds(sock, 4, MAX_FDS)
    if not header:
        return None
    while len(header) < 4:
        more = sock.recv(4 - len(header))
        if not more:
            return None
        header += more
    (size,) = struct.unpack(">I", header)
    if size > MAX_MESSAGE_BYTES:
        raise ValueError(f"message of {size} bytes")
    chunks, left = [], size
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return json.loads(b"".join(chunks)), fds


def flags() -> dict[str, int]:
    return {name: int(getattr(sys.flags, name, 0)) for name in FLAGS}


def ask(path: str, message: dict, timeout_s: float = 2.0, uid: int | None = None) -> dict | None:
    """One control request to the warm server at ``path`` (``{"op": "status"}``, ``drain``…);
    its reply, or None when it does not answer or is not this user's own (:func:`connect`:
    nothing is sent to another uid; ``uid``: the user whose server it must be)."""
    try:
        with connect(path, timeout_s, uid) as conn:
            send_message(conn, message)
            reply = recv_message(conn)
    except (OSError, ValueError):
        return None
    return reply[0] if reply and isinstance(reply[0], dict) else None


def job_sys_path(target: list[str]) -> list[str]:
    """``sys.path`` of ``python <target>`` started as this relay was: the relay's own, without
    the relay's directory, with what ``python`` puts first for ``-m``/``-c``/a script."""
    path = list(sys.path)
    own = os.path.dirname(os.path.realpath(__file__))
    if path and os.path.realpath(path[0] or ".") == own and not sys.flags.safe_path:
        path = path[1:]
    if sys.flags.safe_path:
        return path
    if target[0] == "-m":
        return [os.getcwd(), *path]
    if target[0] == "-c":
        return ["", *path]
    return [os.path.dirname(os.path.realpath(target[0])), *path]


def request(target: list[str]) -> dict[str, object]:
    return {
        "op": "run",
        "argv": target,
        "env": dict(os.environ),
        "cwd": os.getcwd(),
        "path": job_sys_path(target),
        "executable": os.path.realpath(sys.executable),
        "flags": flags(),
        "unbuffered": not sys.stdout.line_buffering and sys.stdout.write_through,
    }


def exit_like(code: int) -> None:
    """Leave as a process that exited with ``code`` (negative: killed by that signal)."""
    sys.stdout.flush()
    sys.stderr.flush()
    if code < 0:
        if -code not in (signal.SIGKILL, signal.SIGSTOP):  # those cannot be handled anyway
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        os._exit(128 - code)  # a signal that does not kill (SIGCONT...): say so as shells do
    os._exit(code & 0xFF)


def go_cold(target: list[str], why: str) -> None:
    """Exec the cold command: this interpreter, its flags, the target."""
    print(f"torchyard: warm start unavailable ({why}); starting cold", file=sys.stderr,
          flush=True)
    orig = list(getattr(sys, "orig_argv", [sys.executable]))
    try:
        interp_flags = orig[1 : orig.index(sys.argv[0], 1)]
    except ValueError:
        interp_flags = []
    os.execv(sys.executable, [sys.executable, *interp_flags, *target])


def main(argv: list[str]) -> None:
    if len(argv) < 3:
        print("usage: relay.py SOCKET (-m MODULE | -c CODE | SCRIPT) [ARGS...]", file=sys.stderr)
        sys.exit(2)
    socket_path, target = argv[1], argv[2:]
    try:
        conn = connect(socket_path, CONNECT_TIMEOUT_S)
    except Untrusted as exc:
        go_cold(target, f"refusing the warm server: {exc}")
        return
    except OSError as exc:
        go_cold(target, f"warm server at {socket_path}: {exc.__class__.__name__}: {exc}")
        return
    try:
        send_message(conn, request(target), [0, 1, 2])
        reply = recv_message(conn)
        conn.settimeout(None)
    except (OSError, ValueError) as exc:
        conn.close()
        go_cold(target, f"warm server at {socket_path}: {exc.__class__.__name__}: {exc}")
        return
    if not isinstance(reply, tuple) or not isinstance(reply[0], dict) or not reply[0].get("ok"):
        why = reply[0].get("reason") if reply and isinstance(reply[0], dict) else "no answer"
        conn.close()
        go_cold(target, str(why))
        return

    def forward(signum: int, _frame: object) -> None:
        try:
            send_message(conn, {"signal": signum})
        except OSError:
            pass  # the server is gone; so is the warm process (it dies with the server)

    for sig in FORWARDED_SIGNALS:
        signal.signal(sig, forward)
    while True:
        try:
            message = recv_message(conn)
        except (OSError, ValueError):
            message = None
        if message is None:
            print("torchyard: the warm server went away; the rank is lost", file=sys.stderr)
            exit_like(1)
        body = message[0]
        if isinstance(body, dict) and "exit" in body:
            exit_like(int(body["exit"]))


if __name__ == "__main__":
    main(sys.argv)
