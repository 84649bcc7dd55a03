"""SIGTERM stops a real server promptly while an event stream and a long poll are open.

Issue 17, finding 5: uvicorn waits for open requests before the app shuts down, so one
``submit --follow`` client held a restart for as long as its job ran. ``service.api.drain``.
"""

import json
import signal
import socket
import threading
import time

import httpx
from httpx_sse import connect_sse

from service.api.drain import SHUTDOWN_GRACE_S
from service.run.proctree import ProcessGroupHandle
from tests.conftest import LiveServer
from tests.fixtures.connections import await_requests_read

SPEC = {"name": "drain", "dataset": "digits", "epochs": 2, "nproc_per_node": 1}


def test_sigterm_ends_streams_and_long_polls_within_the_grace(live_server_factory) -> None:  # type: ignore[no-untyped-def]
    # Epochs of 60 s: the job is far from over when the server is stopped.
    server: LiveServer = live_server_factory(TORCHYARD_TEST_EPOCH_SLEEP_S="60")
    client = httpx.Client(base_url=server.url, timeout=httpx.Timeout(10, read=120))
    job_id = client.post("/jobs", json=SPEC).json()["id"]
    stream_open = threading.Event()
    outcome: dict[str, object] = {}

    def follow() -> None:
        kinds = []
        with connect_sse(client, "GET", f"/jobs/{job_id}/events") as source:
            for sse in source.iter_sse():
                kinds.append(sse.event)
                stream_open.set()
        outcome["stream"] = kinds

    # The long poll on a connection of our own: the test must know its port (below).
    waiter = socket.create_connection(("127.0.0.1", server.port))
    waiter.settimeout(400)
    waiter.sendall(f"GET /jobs/{job_id}/wait?timeout=300 HTTP/1.1\r\n"
                   f"Host: 127.0.0.1:{server.port}\r\nConnection: close\r\n\r\n".encode())

    def long_poll() -> None:
        answer = b""
        while chunk := waiter.recv(65536):
            answer += chunk
        head, _, body = answer.partition(b"\r\n\r\n")
        outcome["wait"] = (int(head.split()[1]), json.loads(body)["state"])

    loop_pid = None
    threads = [threading.Thread(target=follow), threading.Thread(target=long_poll)]
    for t in threads:
        t.start()
    try:
        assert stream_open.wait(30), "the event stream sent nothing"
        # The long poll is in the server's hands (it read the request), not still in transit.
        await_requests_read(server.port, [waiter.getsockname()[1]])
        loop_pid = client.get(f"/jobs/{job_id}").json()["pid"]
        started = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        server.proc.wait(timeout=SHUTDOWN_GRACE_S + 10)
        stopped_s = time.monotonic() - started
        for t in threads:
            t.join(timeout=10)
            assert not t.is_alive(), "a client is still connected after the server exited"
    finally:
        client.close()
        waiter.close()
        # The job outlives the server by design; this test does not restart it: stop it here.
        if loop_pid:
            ProcessGroupHandle(pid=loop_pid).terminate(0)

    # uvicorn re-raises the signal once shut down: -SIGTERM after a complete shutdown.
    assert "Application shutdown complete" in server.log.read_text(), server.log.read_text()[-2000:]
    # Streams end themselves at once (within a poll), not at uvicorn's forced cancel.
    assert stopped_s < SHUTDOWN_GRACE_S, f"shutdown took {stopped_s:.1f} s"
    assert "timeout graceful shutdown exceeded" not in server.log.read_text()
    assert outcome["wait"][0] == 200 and outcome["wait"][1] not in ("succeeded", "failed")  # type: ignore[index]
    assert outcome["stream"] and outcome["stream"][0] == "state"  # type: ignore[index]
