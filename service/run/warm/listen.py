"""The warm server's socket: one server per socket (a lock), a socket only this user can reach,
and peers of this user only. See ``service.run.warm.server``.
"""

import fcntl
import os
import socket
import stat
import time

from service.run.warm import LOCK_NAME, relay

# A pool's probe holds the lock for microseconds; a live server holds it until it drains.
LOCK_WAIT_S = 0.5
# A peer that sends half a message must not stall the server (and every other job's hand-off).
PEER_TIMEOUT_S = 1.0


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


def accept(listener: socket.socket) -> socket.socket | None:
    """The next connection, or None when its peer is neither this user nor root (closed at
    once: only our own user may hand work to this server; root, which can do anything as this
    user anyway, is the torchyard server whose pool started a job user's warm server and asks
    it for its status)."""
    conn, _ = listener.accept()
    if relay.peer_uid(conn) not in (os.getuid(), 0):
        conn.close()
        return None
    conn.settimeout(PEER_TIMEOUT_S)
    return conn
