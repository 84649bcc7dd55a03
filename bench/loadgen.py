"""A minimal HTTP/1.1 keep-alive client on asyncio streams, for many concurrent pollers.

Why not httpx: with 200 concurrent connections its async pool cost the client ~2x the CPU the
server spent, on the same 2 cores, so the figure measured the client. This sends a GET (or a
POST with a body) and reads one ``Content-Length`` response; enough for torchyard's JSON routes
on 127.0.0.1, nothing more (no chunked bodies, redirects or TLS).
"""

import asyncio
import json
from typing import Any


class Connection:
    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def request(
        self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
    ) -> tuple[int, Any]:
        """(status, parsed JSON body). Reconnects once if the kept connection was closed."""
        for attempt in (1, 2):
            if self._writer is None:
                self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
            try:
                return await self._exchange(method, path, body, headers or {})
            except (ConnectionError, asyncio.IncompleteReadError):
                await self.close()
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    async def _exchange(
        self, method: str, path: str, body: bytes, headers: dict[str, str]
    ) -> tuple[int, Any]:
        assert self._reader is not None and self._writer is not None
        lines = [f"{method} {path} HTTP/1.1", f"Host: {self.host}:{self.port}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        if body or method == "POST":
            lines += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
        self._writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
        head = await self._reader.readuntil(b"\r\n\r\n")
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        status = int(status_line.split(" ", 2)[1])
        length = 0
        for line in header_lines:
            name, _, value = line.partition(":")
            if name.lower() == "content-length":
                length = int(value)
        payload = await self._reader.readexactly(length)
        return status, json.loads(payload) if payload else None

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            try:
                await self._writer.wait_closed()
            except ConnectionError:
                pass
        self._reader = self._writer = None
