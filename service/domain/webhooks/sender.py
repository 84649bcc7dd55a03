"""One try of a webhook delivery on the wire, under one deadline for the whole try.

httpx's timeouts bound each network operation (a connect, a write, a read), not a request: a
receiver that answers one byte every few seconds never trips a read timeout, and held a sender
thread for ~10 minutes (issue 44). Here each try is a coroutine on an event loop of the sender's
own (one thread: an anyio blocking portal), run under ``anyio.fail_after(deadline_s)``: the
connection (DNS, TCP, TLS), the request with its body and the answer's status line and headers
together end by the deadline, or the try fails and the coroutine is cancelled, closing its
connection. The answer's body is never read (its connection is closed instead of reused), so
a receiver cannot hold a try past the deadline by streaming one.

The calling thread (a delivery sender, ``service.domain.webhooks.delivery``) waits for the
outcome, which comes by the deadline. The loop and the HTTP client start with the first try:
most servers send none, and the client's TLS context (certifi's CA bundle) costs ~40 ms of CPU.
"""

import threading
from concurrent.futures import CancelledError
from contextlib import ExitStack
from dataclasses import dataclass

import anyio
import httpx
from anyio.from_thread import BlockingPortal, start_blocking_portal

# A stopping sender closes its client's connections for at most this long.
CLOSE_S = 1.0


class SenderStopped(Exception):
    """The sender was stopped before or during the try: it has no outcome to store."""


@dataclass(frozen=True)
class Outbound:
    """What goes on the wire for one try: the body and the Standard Webhooks headers."""

    url: str
    body: bytes
    headers: dict[str, str]


class Sender:
    """POSTs deliveries, each try bounded by ``deadline_s`` in all; safe to call from many
    threads at once (at most ``max_connections`` connections)."""

    def __init__(self, deadline_s: float, max_connections: int) -> None:
        self.deadline_s = deadline_s
        self.max_connections = max_connections
        self._lock = threading.Lock()
        self._stopped = False
        self._stack: ExitStack | None = None
        self._portal: BlockingPortal | None = None
        self._client: httpx.AsyncClient | None = None

    def post(self, request: Outbound) -> tuple[int | None, str | None]:
        """(status code, error) of one try: error None for a 2xx, else why it failed (never
        the URL: it may hold a token). Raises :class:`SenderStopped` once :meth:`close` ran."""
        portal = self._started()
        if portal is None:
            raise SenderStopped
        try:
            code = portal.call(self._post, request)
        except TimeoutError:
            return None, f"no complete answer within {self.deadline_s:g}s (the try's deadline)"
        except httpx.TimeoutException:
            return None, f"no answer within {self.deadline_s:g}s"
        except httpx.HTTPError as exc:
            # The exception's class only: its text may quote the URL (a token in its path).
            return None, f"could not reach the endpoint ({type(exc).__name__})"
        except (CancelledError, RuntimeError):  # stopped while this try was in flight
            raise SenderStopped from None
        if 200 <= code < 300:
            return code, None
        return code, f"answered HTTP {code}"

    async def _post(self, request: Outbound) -> int:
        assert self._client is not None
        with anyio.fail_after(self.deadline_s):
            async with self._client.stream(
                "POST", request.url, content=request.body, headers=request.headers
            ) as response:
                return response.status_code

    def _started(self) -> BlockingPortal | None:
        """The loop, started at the first try; None once stopped."""
        with self._lock:
            if self._stopped:
                return None
            if self._portal is None:
                stack = ExitStack()
                portal = stack.enter_context(start_blocking_portal(name="torchyard-webhook-io"))
                self._client = portal.call(self._new_client)
                self._stack, self._portal = stack, portal
            return self._portal

    async def _new_client(self) -> httpx.AsyncClient:
        n = self.max_connections
        return httpx.AsyncClient(
            # Each operation's own bound too; the try's deadline (``_post``) bounds them all.
            timeout=httpx.Timeout(self.deadline_s),
            limits=httpx.Limits(max_connections=n, max_keepalive_connections=n),
            follow_redirects=False,
        )

    def close(self) -> None:
        """Stop: tries in flight end at once and later ones are refused, each raising
        :class:`SenderStopped`."""
        with self._lock:
            self._stopped = True
            stack, portal, client = self._stack, self._portal, self._client
            self._stack = self._portal = self._client = None
        if stack is None or portal is None:
            return
        try:
            if client is not None:
                portal.call(self._close_client, client)
            portal.call(portal.stop, True)  # cancels the tries still in flight
        except RuntimeError:  # the loop ended already
            pass
        stack.close()  # joins the loop's thread

    @staticmethod
    async def _close_client(client: httpx.AsyncClient) -> None:
        with anyio.move_on_after(CLOSE_S):
            await client.aclose()
