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

Imports only the standard library and nothing of ``service`` (it runs by path, with the job's
``sys.path``). This module also owns the wire format both sides use: a message is a 4-byte
big-endian length, then that much JSON; file descriptors ride on the length's ``sendmsg``.
"""

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
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.settimeout(CONNECT_TIMEOUT_S)
        conn.connect(socket_path)
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
