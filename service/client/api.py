"""``TorchyardClient``: the REST API over httpx, as the CLI uses it. No torch, no server imports.

Errors come back as :class:`ClientError` carrying the server's ``error``/``message`` (or
``unreachable`` when no answer came), so commands can print one line and pick an exit code.
"""

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Self
from urllib.parse import quote

import httpx
from httpx_sse import connect_sse

from torchyard_contract.state import TERMINAL_STATES

TERMINAL = frozenset(state.value for state in TERMINAL_STATES)
WAIT_CHUNK_S = 30.0  # one long poll of GET /jobs/{id}/wait
POLL_S = 1.0  # fallback polling interval when the server has no /wait
# Event streams send a keep-alive comment every 15 s; a read silent for longer is a dead link.
STREAM_TIMEOUT = httpx.Timeout(30.0, read=60.0)
STREAM_RECONNECTS = 20


class ClientError(Exception):
    def __init__(self, status: int, error: str, message: str) -> None:
        super().__init__(message)
        self.status, self.error, self.message = status, error, message


@dataclass(frozen=True)
class Event:
    """One server-sent event: ``kind`` is ``state`` or ``metric``; ``data`` is the decoded JSON."""

    kind: str
    id: str
    data: dict[str, Any]


def _raise_for(response: httpx.Response) -> None:
    if response.status_code < 400:
        return
    try:
        body = response.json()
        error, message = body.get("error", "http_error"), body.get("message", response.text)
    except ValueError:
        error, message = "http_error", response.text or response.reason_phrase
    raise ClientError(response.status_code, error, message)


class TorchyardClient:
    """A client for one server. ``token`` (if any) is sent as ``Authorization: Bearer``."""

    def __init__(self, url: str, token: str | None = None, timeout_s: float = 30.0) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.url = url.rstrip("/")
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout_s)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self._http.close()

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise ClientError(0, "unreachable", f"cannot reach {self.url}: {exc}") from exc
        _raise_for(response)
        return response.json()

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        """Any API call: the decoded JSON answer (None for 204); errors as ``ClientError``."""
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise ClientError(0, "unreachable", f"cannot reach {self.url}: {exc}") from exc
        _raise_for(response)
        return response.json() if response.status_code != 204 else None

    def has_package(self, digest: str) -> bool:
        """``HEAD /packages/{digest}``: whether the server holds it already."""
        try:
            response = self._http.head(f"/packages/{digest}")
        except httpx.TransportError as exc:
            raise ClientError(0, "unreachable", f"cannot reach {self.url}: {exc}") from exc
        if response.status_code == 404:
            return False
        _raise_for(response)
        return True

    def upload_package(self, chunks: Iterator[bytes], size: int) -> dict[str, Any]:
        return self._call("POST", "/packages", content=chunks, timeout=None, headers={
            "Content-Type": "application/octet-stream", "Content-Length": str(size)})

    def delete(self, job_id: int) -> None:
        try:
            response = self._http.delete(f"/jobs/{job_id}")
        except httpx.TransportError as exc:
            raise ClientError(0, "unreachable", f"cannot reach {self.url}: {exc}") from exc
        _raise_for(response)

    def artifacts(self, job_id: int, after: str | None = None) -> dict[str, Any]:
        params = {"limit": 1000, **({"after": after} if after else {})}
        return self._call("GET", f"/jobs/{job_id}/artifacts", params=params)

    def download(self, job_id: int, path: str, out: Any) -> int:
        """Stream one artifact (by its listed path, quoted here) into the binary file ``out``;
        bytes written."""
        written = 0
        try:
            with self._http.stream("GET", f"/jobs/{job_id}/artifacts/{quote(path, safe='/')}",
                                   timeout=None) as response:
                if response.status_code >= 400:
                    response.read()
                    _raise_for(response)
                for chunk in response.iter_bytes(1024 * 1024):
                    out.write(chunk)
                    written += len(chunk)
        except httpx.TransportError as exc:
            raise ClientError(0, "unreachable", f"cannot reach {self.url}: {exc}") from exc
        return written

    def submit(self, spec: dict[str, Any]) -> dict[str, Any]:
        return self._call("POST", "/jobs", json=spec)

    def job(self, job_id: int) -> dict[str, Any]:
        return self._call("GET", f"/jobs/{job_id}")

    def jobs(self, **params: Any) -> dict[str, Any]:
        return self._call("GET", "/jobs", params={k: v for k, v in params.items() if v})

    def stacks(self, job_id: int, attempt: int | None = None) -> dict[str, Any]:
        params = {"attempt": attempt} if attempt is not None else {}
        return self._call("GET", f"/jobs/{job_id}/stacks", params=params)

    def cancel(self, job_id: int) -> dict[str, Any]:
        return self._call("POST", f"/jobs/{job_id}/cancel")

    def pause(self, job_id: int) -> dict[str, Any]:
        return self._call("POST", f"/jobs/{job_id}/pause")

    def resume(self, job_id: int) -> dict[str, Any]:
        return self._call("POST", f"/jobs/{job_id}/resume")

    def create_sweep(self, spec: dict[str, Any]) -> dict[str, Any]:
        return self._call("POST", "/sweeps", json=spec)

    def sweep(self, sweep_id: int) -> dict[str, Any]:
        return self._call("GET", f"/sweeps/{sweep_id}")

    def cancel_sweep(self, sweep_id: int) -> dict[str, Any]:
        return self._call("POST", f"/sweeps/{sweep_id}/cancel")

    def metrics(self, job_id: int, **params: Any) -> dict[str, Any]:
        params = {k: v for k, v in params.items() if v is not None}
        return self._call("GET", f"/jobs/{job_id}/metrics", params=params)

    def all_metrics(self, job_id: int, **params: Any) -> list[dict[str, Any]]:
        """Every record so far, following the ``after`` cursor."""
        items: list[dict[str, Any]] = []
        after = 0
        while True:
            page = self.metrics(job_id, after=after, limit=10_000, **params)
            items += page["items"]
            if not page["items"]:
                return items
            after = page["next_after"]

    def summary(self, job_id: int, name: str = "loss", threshold: float | None = None) -> dict:
        params: dict[str, Any] = {"name": name}
        if threshold is not None:
            params["threshold"] = threshold
        return self._call("GET", f"/jobs/{job_id}/metrics/summary", params=params)

    def logs(
        self, job_id: int, rank: int, offset: int, attempt: int | None = None,
        stream: str | None = None,
    ) -> dict:
        """``stream`` None: both streams in the order written (the server's default)."""
        params: dict[str, Any] = {"rank": rank, "offset": offset}
        if stream is not None:
            params["stream"] = stream
        if attempt is not None:
            params["attempt"] = attempt
        return self._call("GET", f"/jobs/{job_id}/logs", params=params)

    def wait(self, job_id: int, timeout_s: float | None) -> dict[str, Any]:
        """The job once terminal, or as it is when ``timeout_s`` ran out (None: no limit).

        Long-polls ``GET /jobs/{id}/wait``; falls back to polling ``GET /jobs/{id}`` when the
        server has no such route (404 that is not "job not found", 405, or 422).
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        long_poll = True
        job = self.job(job_id)  # 404 for an unknown job, before any waiting
        while job["state"] not in TERMINAL:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                break
            chunk = WAIT_CHUNK_S if left is None else max(min(WAIT_CHUNK_S, left), 0.1)
            if long_poll:
                try:
                    job = self._call(
                        "GET", f"/jobs/{job_id}/wait", params={"timeout": round(chunk, 1)},
                        timeout=chunk + 30,
                    )
                    continue
                except ClientError as exc:
                    if exc.status not in (404, 405, 422) or exc.error == "not_found":
                        raise
                    long_poll = False
            time.sleep(min(POLL_S, chunk))
            job = self.job(job_id)
        return job

    def events(self, job_id: int, last_event_id: str | None = None) -> Iterator[Event]:
        """The job's event stream until it ends (the job is terminal and every record sent).

        A dropped connection is resumed with ``Last-Event-ID``, so no event is lost or repeated.
        """
        failures = 0
        while True:
            headers = {"Last-Event-ID": last_event_id} if last_event_id else {}
            try:
                with connect_sse(
                    self._http, "GET", f"/jobs/{job_id}/events", headers=headers,
                    timeout=STREAM_TIMEOUT,
                ) as source:
                    if source.response.status_code >= 400:
                        source.response.read()
                        _raise_for(source.response)
                    for sse in source.iter_sse():
                        if not sse.event or sse.event == "message":
                            continue
                        last_event_id = sse.id
                        failures = 0
                        event = Event(sse.event, sse.id, sse.json())
                        yield event
                        if event.kind == "state" and event.data["state"] in TERMINAL:
                            return
                lost: Exception = ConnectionError("the stream closed before the job ended")
            except httpx.TransportError as exc:
                lost = exc
            failures += 1
            if failures > STREAM_RECONNECTS:
                raise ClientError(0, "unreachable", f"event stream lost: {lost}")
            time.sleep(min(0.5 * failures, 5.0))
