"""A pass-through proxy in front of the test's MLflow server that keeps one answer back: the
first ``log-batch`` carrying metrics goes through to MLflow, which stores it, and its answer is
held until ``release``. A torchyard server exporting through it is then caught between sending a
batch and recording MLflow's answer — with no pause of its own to set
(``tests/tracking/test_export_restarts.py``)."""

import asyncio
import json
import threading

import httpx
from fastapi import FastAPI, Request, Response

METHODS = ["GET", "POST", "PATCH", "PUT", "DELETE"]


class HoldProxy:
    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.held = threading.Event()  # a metrics batch is in MLflow; its answer is kept back
        self._loop: asyncio.AbstractEventLoop | None = None
        self._release: asyncio.Event | None = None

    def _holds(self, path: str, body: bytes) -> bool:
        if self.held.is_set() or not path.endswith("runs/log-batch"):
            return False
        try:
            return bool(json.loads(body).get("metrics"))
        except (ValueError, AttributeError):
            return False

    def release(self) -> None:
        """Let the held answer go (from any thread); later requests pass straight through."""
        if self._loop is not None and self._release is not None:
            self._loop.call_soon_threadsafe(self._release.set)

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.api_route("/{path:path}", methods=METHODS)
        async def forward(path: str, request: Request) -> Response:
            body = await request.body()
            async with httpx.AsyncClient(base_url=self.upstream, timeout=60) as client:
                answer = await client.request(
                    request.method, f"/{path}", params=request.query_params, content=body,
                    headers={"content-type": request.headers.get("content-type", "")},
                )
            if self._holds(path, body):
                self._loop, self._release = asyncio.get_running_loop(), asyncio.Event()
                self.held.set()
                await self._release.wait()
            return Response(answer.content, status_code=answer.status_code,
                            media_type=answer.headers.get("content-type"))

        return app
