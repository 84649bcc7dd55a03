"""``torchyard serve --fd N``: a listening socket handed to the server (docs/operations.md).

Every live server of the suite is started this way (``tests/fixtures/servers.py``), so a job's
records reaching its server prove the served address is the socket's; here, what is refused and
how ``--workers`` shares the socket.
"""

import os
import socket
import subprocess
import sys
from pathlib import Path

import httpx

from service.serve import process_sockets
from tests.conftest import REPO_ROOT, child_environ


def _serve(tmp_path: Path, *args: str, pass_fds: tuple[int, ...] = (), **env: str,
           ) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "service", "serve", *args],
        env={**child_environ(), "TORCHYARD_HOME": str(tmp_path / "home"), "TORCHYARD_GPUS": "none",
             "TORCHYARD_WARM_RANKS": "false", "TORCHYARD_API_TOKENS": "", **env},
        cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        pass_fds=pass_fds, start_new_session=True,
    )


def test_a_public_socket_is_refused_without_tokens_as_a_public_host_is(tmp_path: Path) -> None:
    """The loopback rule applies to the handed socket's address: 0.0.0.0 without API tokens
    is refused before anything is served."""
    with socket.create_server(("0.0.0.0", 0)) as sock:
        proc = _serve(tmp_path, "--fd", str(sock.fileno()), pass_fds=(sock.fileno(),))
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2, out
    assert "refusing to bind '0.0.0.0' without API tokens" in out


def test_what_is_not_a_listening_tcp_socket_is_refused(tmp_path: Path) -> None:
    read_end, write_end = os.pipe()
    try:
        proc = _serve(tmp_path, "--fd", str(read_end), pass_fds=(read_end,))
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 2 and f"--fd {read_end}:" in out, out
    finally:
        os.close(read_end)
        os.close(write_end)
    with socket.socket() as unbound:  # a TCP socket that does not listen
        proc = _serve(tmp_path, "--fd", str(unbound.fileno()), pass_fds=(unbound.fileno(),))
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "is not a listening TCP socket" in out, out
    proc = _serve(tmp_path, "--fd", "3", "--port", "8000")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "leave --host and --port out" in out, out


def test_a_connection_made_before_the_server_is_up_is_answered(tmp_path: Path) -> None:
    """The socket listens before the server starts: a request sent at once waits in it and is
    answered, where binding the port itself would have refused it."""
    with socket.create_server(("127.0.0.1", 0)) as sock:
        port = sock.getsockname()[1]
        proc = _serve(tmp_path, "--fd", str(sock.fileno()), pass_fds=(sock.fileno(),))
    try:
        with httpx.Client(timeout=60) as c:  # sent before the server has imported its app
            r = c.get(f"http://127.0.0.1:{port}/healthz")
        assert r.status_code == 200, r.text
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
    assert f"listening on 127.0.0.1:{port}" in out, out


def test_api_processes_get_sockets_of_their_own_where_the_handed_one_allows_it() -> None:
    with socket.socket() as plain:
        plain.bind(("127.0.0.1", 0))
        plain.listen()
        assert process_sockets(plain, 3) == [plain] * 3  # all accept from the one handed
    with socket.socket() as shared:
        shared.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        shared.bind(("127.0.0.1", 0))
        shared.listen()
        sockets = process_sockets(shared, 3)
        try:
            assert sockets[0] is shared and len({id(s) for s in sockets}) == 3
            assert {s.getsockname() for s in sockets} == {shared.getsockname()}
        finally:
            for sock in sockets[1:]:
                sock.close()
