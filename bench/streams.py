"""Commit → SSE event: ``streams`` raw ``GET /jobs/<id>/events`` readers on one running job
while a writer posts one record every ``SSE_PERIOD_S``; each record carries its send time, so the
latency is *POST sent → event received* on every stream (an upper bound of commit → event: it
includes the POST's own parsing and commit)."""

import asyncio
import json
import time
from urllib.parse import urlsplit

from bench.common import percentile
from bench.server import Server

SSE_PERIOD_S = 0.05
SSE_RANK = 7


async def sse_latency(server: Server, job_id: int, token: str, streams: int,
                       duration_s: float) -> dict[str, float]:
    """``streams`` raw SSE readers; a writer posts one record (value = its send time) per period."""
    url = urlsplit(server.url)
    host, port = url.hostname or "127.0.0.1", url.port or 80
    latencies: list[float] = []
    opened = 0
    stop = asyncio.Event()

    async def stream() -> None:
        nonlocal opened
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(f"GET /jobs/{job_id}/events HTTP/1.1\r\nHost: {host}\r\n"
                     "Accept: text/event-stream\r\n\r\n".encode())
        await reader.readuntil(b"\r\n\r\n")
        opened += 1
        event = None
        try:
            while not stop.is_set():
                line = await asyncio.wait_for(reader.readline(), 5)
                if line.startswith(b"event:"):
                    event = line[6:].strip()
                elif line.startswith(b"data:") and event == b"metric":
                    record = json.loads(line[5:])
                    if record["rank"] == SSE_RANK:
                        latencies.append(time.time() - record["value"])
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def write() -> int:
        from bench.loadgen import Connection

        while opened < streams:
            await asyncio.sleep(0.05)
        await asyncio.sleep(1.0)  # every stream has caught up with the history
        conn = Connection(host, port)
        headers = {"Authorization": f"Bearer {token}"}
        posted, step = 0, 0
        deadline = time.monotonic() + duration_s
        try:
            while time.monotonic() < deadline:
                now = time.time()
                body = json.dumps({"records": [{"attempt": 1, "rank": SSE_RANK, "epoch": 1,
                                                "step": step,
                                                "name": "loss", "value": now, "time": now}]})
                status, _ = await conn.request("POST", f"/jobs/{job_id}/records", body.encode(),
                                               headers)
                posted += status == 200
                step += 1
                await asyncio.sleep(SSE_PERIOD_S)
        finally:
            await conn.close()
        await asyncio.sleep(1.0)
        stop.set()
        return posted

    readers = [asyncio.create_task(stream()) for _ in range(streams)]
    posted = await write()
    await asyncio.gather(*readers)
    return {
        "posted": posted,
        "events": len(latencies),
        "p50_ms": percentile(latencies, 50) * 1000,
        "p99_ms": percentile(latencies, 99) * 1000,
    }
