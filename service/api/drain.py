"""Shutdown that does not wait on clients: event streams and long polls end when the server stops.

On SIGTERM uvicorn stops accepting connections, then waits for every open request to finish
before the app's shutdown runs: one ``submit --follow`` (an event stream) or a ``/wait`` long poll
(up to 300 s) would hold a restart until the service manager killed the server. So
``DrainingServer`` sets the app's ``draining`` event as soon as the signal arrives: the event
stream ends (a client resumes it with ``Last-Event-ID`` once the server is back), ``/wait``
answers with the job as it is (as on its timeout), and whatever is still open after
``SHUTDOWN_GRACE_S`` is cancelled by uvicorn.
"""

import socket
import threading
from types import FrameType

import uvicorn
from fastapi import FastAPI, Request

# Streams and long polls notice the drain within one poll (≤ 0.5 s); this bounds the rest.
SHUTDOWN_GRACE_S = 5.0


def draining(request: Request) -> threading.Event:
    """Set once the server is shutting down (``create_app`` makes one per app)."""
    return request.app.state.draining


class DrainingServer(uvicorn.Server):
    """``uvicorn.Server`` that tells the app it is draining the moment a stop signal arrives."""

    def __init__(self, config: uvicorn.Config, drain: threading.Event) -> None:
        super().__init__(config)
        self.drain = drain

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.drain.set()
        super().handle_exit(sig, frame)


def serve(
    app: FastAPI, host: str = "127.0.0.1", port: int = 8000,
    sockets: list[socket.socket] | None = None,
) -> None:
    """Run ``app`` until SIGTERM/SIGINT; open streams and long polls end within the grace.
    ``sockets``: already listening ones to serve on instead of binding ``host:port``."""
    config = uvicorn.Config(
        app, host=host, port=port, log_level="info",
        timeout_graceful_shutdown=int(SHUTDOWN_GRACE_S),
    )
    DrainingServer(config, app.state.draining).run(sockets=sockets)
