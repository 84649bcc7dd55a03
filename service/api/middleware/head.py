"""``HEAD`` on every ``GET`` route (RFC 9110 §9.3.2: the same status and headers as ``GET``,
without the body). FastAPI routes answer only the methods they declare, so load balancers,
uptime checks and link checkers probing with ``HEAD`` got ``405`` on ``/jobs``.

The request is routed as ``GET`` (so the same auth, guards and validation apply) and answered
with the status line and headers of the ``GET`` answer — ``Content-Length`` included — and an
empty body, sent as soon as the headers are: a stream (``/jobs/{id}/events``) is not waited for,
and what it sends later is not produced (the stream is told the client left). The OpenAPI
document is unchanged: ``HEAD`` is implied by ``GET``.
"""

from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send


class _HeadAnswered(OSError):
    """Raised to a route that keeps sending after its HEAD answer went out (a stream): Starlette
    takes an ``OSError`` from ``send`` as the client gone."""


class HeadAsGetMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return
        answered = False

        async def receive_as_get() -> Message:
            if answered:
                return {"type": "http.disconnect"}
            return await receive()

        async def send_headers_only(message: Message) -> None:
            nonlocal answered
            if message["type"] == "http.response.start":
                await send(message)
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                answered = True
            elif message.get("more_body", False):  # a stream: stop it
                raise _HeadAnswered("HEAD: the answer was sent without its body")
            # else: the body (or the last of it): not sent

        try:
            await self.app({**scope, "method": "GET"}, receive_as_get, send_headers_only)
        except (_HeadAnswered, ClientDisconnect):
            if not answered:
                raise
