"""Request body size limit: 413 before the app parses anything.

Contract: a request whose ``Content-Length`` exceeds ``max_bytes`` is answered 413 without reading
its body. A request without ``Content-Length`` (chunked) is read here up to ``max_bytes`` (413 as
soon as it passes them) and then handed to the app in one piece; later ``receive`` calls go to the
server as usual (disconnect detection for streams keeps working). The server (h11/httptools)
never delivers more than a declared ``Content-Length``.
"""

from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.errors import error_body


class BodyLimitMiddleware:
    """``streamed``: (method, path) pairs whose route reads its body as a stream and enforces
    its own limit (``POST /packages``); passed through untouched."""

    def __init__(
        self, app: ASGIApp, *, max_bytes: int, streamed: frozenset[tuple[str, str]] = frozenset(),
    ) -> None:
        self.app, self.max_bytes, self.streamed = app, max_bytes, streamed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or (scope.get("method"), scope.get("path")) in self.streamed:
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared == -1:
            await _reply(scope, send, 400, "invalid_request", "invalid Content-Length header")
            return
        if declared is not None:
            if declared > self.max_bytes:
                await self._too_large(scope, send)
                return
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away before sending its body
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._too_large(scope, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        await self.app(scope, _replay(b"".join(chunks), receive), send)

    async def _too_large(self, scope: Scope, send: Send) -> None:
        await _reply(scope, send, 413, "payload_too_large",
                     f"the request body exceeds {self.max_bytes} bytes")


def _content_length(scope: Scope) -> int | None:
    """The declared length; None if absent; -1 if malformed."""
    for key, value in scope.get("headers", []):
        if key.lower() == b"content-length":
            text = value.decode("latin-1").strip()
            return int(text) if text.isdigit() else -1
    return None


def _replay(body: bytes, receive: Receive) -> Receive:
    delivered = False

    async def replay() -> Message:
        nonlocal delivered
        if delivered:
            return await receive()
        delivered = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


async def _reply(scope: Scope, send: Send, status: int, error: str, message: str) -> None:
    async def no_receive() -> Message:
        return {"type": "http.disconnect"}

    await JSONResponse(error_body(error, message), status_code=status)(scope, no_receive, send)
