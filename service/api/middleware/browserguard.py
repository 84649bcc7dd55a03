"""What a browser tab may not do to the API: DNS rebinding, cross-site writes, form posts.

A loopback-only server without API tokens is open to every process on the host, and so, through
the operator's browser, to every web page it visits unless the requests a page can make are
refused (docs/security.md, "Browsers"):

* **Host** (only without API tokens, where it is the only gate): the ``Host`` header must be an
  IP address, ``localhost``, the bound host name, the host of ``TORCHYARD_PUBLIC_URL``, or one
  of ``TORCHYARD_ALLOWED_HOSTS``. A DNS-rebinding page reaches the server under its own name
  (``rebind.evil.example``), which is none of those; an IP address cannot be rebound. → 403.
* **Origin** (always): a state-changing request (not GET/HEAD/OPTIONS) that carries an
  ``Origin`` must come from the server's own origin or a ``TORCHYARD_CORS_ORIGINS`` one. CLI,
  SDK and ranks send no ``Origin``. → 403.
* **Content type** (always): a state-changing request with a body, or with any
  ``Content-Type``, must say ``application/json`` (or ``…+json``): an HTML form can only send
  ``application/x-www-form-urlencoded``, ``multipart/form-data`` or ``text/plain``. → 415.

Pure ASGI, so event streams pass through untouched.
"""

import ipaddress
from collections.abc import Iterable
from urllib.parse import urlsplit

from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.errors import error_body

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# The methods whose body a route reads: only these are held to JSON (any other, TRACE say, is
# routed and answered 405, whatever body it carries).
BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
LOOPBACK_NAMES = frozenset({"localhost"})


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return value.decode("latin-1").strip()
    return None


def host_name(host_header: str) -> str:
    """``'[::1]:8000'`` → ``'::1'``; ``'Example.org:80'`` → ``'example.org'``."""
    text = host_header.strip().lower()
    if text.startswith("["):
        return text[1:].partition("]")[0]
    if text.count(":") == 1:
        return text.partition(":")[0]
    return text  # no port, or a bare IPv6 address


def is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def is_json(content_type: str) -> bool:
    media = content_type.partition(";")[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and
                                            media.endswith("+json"))


class BrowserGuardMiddleware:
    """See the module docstring. ``check_host``: False when API tokens are on."""

    def __init__(
        self, app: ASGIApp, *, check_host: bool, host_names: Iterable[str],
        origins: Iterable[str],
    ) -> None:
        self.app, self.check_host = app, check_host
        self.host_names = LOOPBACK_NAMES | {host_name(n) for n in host_names if n}
        self.origins = {o.rstrip("/").lower() for o in origins}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = self._refusal(scope)
        if refusal is not None:
            status, error, message = refusal
            await JSONResponse(error_body(error, message), status_code=status)(
                scope, _no_receive, send
            )
            return
        await self.app(scope, receive, send)

    def _refusal(self, scope: Scope) -> tuple[int, str, str] | None:
        host = _header(scope, b"host")
        if self.check_host and host is not None:
            name = host_name(host)
            if not is_ip(name) and name not in self.host_names:
                return 403, "forbidden", (
                    f"Host {host!r} is not a name of this server (DNS rebinding?); add it to "
                    "TORCHYARD_ALLOWED_HOSTS to serve it")
        if scope.get("method", "GET") in SAFE_METHODS:
            return None
        origin = _header(scope, b"origin")
        if origin is not None and not self._same_origin(origin, scope, host):
            return 403, "forbidden", (
                f"Origin {origin!r} may not change anything here (cross-site request); "
                "allow it with TORCHYARD_CORS_ORIGINS")
        return None

    def _same_origin(self, origin: str, scope: Scope, host: str | None) -> bool:
        origin = origin.rstrip("/").lower()
        if origin in self.origins:
            return True
        parts = urlsplit(origin)
        return host is not None and parts.scheme == scope.get("scheme", "http") and (
            parts.netloc == host.lower())


class JsonBodyMiddleware:
    """415 for a state-changing request whose body is not JSON (see the module docstring).

    Inside auth and the body limit, so a caller without a token learns 401 first.
    ``binary``: (method, path) pairs that take an archive, not JSON (``POST /packages``); any
    other method on such a path is left to routing (405), whatever its body."""

    def __init__(self, app: ASGIApp, binary: frozenset[tuple[str, str]] = frozenset()) -> None:
        self.app, self.binary = app, binary
        self.binary_paths = frozenset(path for _, path in binary)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (scope["type"] == "http" and scope.get("method", "GET") in BODY_METHODS
                and scope.get("path") not in self.binary_paths):
            content_type = _header(scope, b"content-type")
            has_body = _header(scope, b"content-length") not in (None, "0") or (
                _header(scope, b"transfer-encoding") is not None)
            if (content_type is not None or has_body) and not is_json(content_type or ""):
                message = f"Content-Type must be application/json; got {content_type or 'none'!r}"
                await JSONResponse(error_body("unsupported_media_type", message), 415)(
                    scope, _no_receive, send
                )
                return
        await self.app(scope, receive, send)


async def _no_receive() -> Message:
    return {"type": "http.disconnect"}
