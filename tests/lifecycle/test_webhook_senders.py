"""The webhook senders (issue 44, items 5 and 15b): one deadline per try, a fair share of
senders per endpoint, and deliveries that outlive a deleted job.

The dispatcher (``service.domain.webhooks.delivery``) runs here as the supervisor runs it, on a
database migrated by Alembic, holding the real lease, against real HTTP receivers on 127.0.0.1:
a healthy one, and a slow one that answers one byte at a time, forever, each byte well within
any per-read timeout.
"""

import json
import select as sockets
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from service.domain.files.cleanup import Cleanup
from service.domain.lease import Lease
from service.domain.webhooks.delivery import Dispatcher
from service.settings import Settings
from service.store import outbox
from service.store import repository as repo
from service.store.tables import WebhookDelivery
from tests.conftest import both_stores
from torchyard_contract.spec import JobSpec
from torchyard_contract.state import JobState

SECRET = "whsec_dG9yY2h5YXJkLXNlbmRlcnMtdGVzdA=="
DEADLINE_S = 3.0  # TORCHYARD_WEBHOOK_TIMEOUT_S here: the whole try's
TRICKLE_S = 0.3  # the slow receiver's pace: far inside any per-read timeout


class Healthy:
    """Answers 204 at once; keeps the (job id, event) of each request and when it came."""

    def __init__(self) -> None:
        self.received: list[tuple[int, str]] = []
        self.at: dict[tuple[int, str], float] = {}  # monotonic
        self.changed = threading.Condition()
        healthy = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                data = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["data"]
                self.send_response(204)
                self.send_header("Content-Length", "0")
                self.end_headers()
                with healthy.changed:
                    healthy.received.append((data["job_id"], data["event"]))
                    healthy.at[(data["job_id"], data["event"])] = time.monotonic()
                    healthy.changed.notify_all()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait_for(self, expected: tuple[int, str], timeout_s: float = 30) -> None:
        with self.changed:
            assert self.changed.wait_for(lambda: expected in self.received, timeout_s), (
                f"{expected} not received; got {self.received}")

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Trickle:
    """Reads a request, then answers ``HTTP/1.1 200 OK`` and an endless header one byte every
    ``TRICKLE_S``: never done, never silent long enough for a read timeout. Keeps when each
    connection was accepted and when the client closed it (seen at once: the socket turns
    readable with nothing to read)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/hook"
        self.tries: list[list[float]] = []  # [accepted, closed by the client] (monotonic)
        self.lock = threading.Lock()
        self._stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with self.lock:
                self.tries.append([time.monotonic()])
                entry = self.tries[-1]
            threading.Thread(target=self._answer, args=(conn, entry), daemon=True).start()

    def _answer(self, conn: socket.socket, entry: list[float]) -> None:
        answer = b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 100_000
        with conn:
            try:
                conn.recv(65536)  # the request (the rest of it, if any, is read below)
                for byte in answer:
                    readable, _, _ = sockets.select([conn], [], [], TRICKLE_S)
                    if (readable and not conn.recv(65536)) or self._stop.is_set():
                        return  # the client closed: what the deadline should make it do
                    conn.sendall(bytes([byte]))
            except OSError:  # the client reset the connection
                pass
            finally:
                with self.lock:
                    entry.append(time.monotonic())

    def open_at(self, when: float) -> int:
        """Tries in flight at ``when`` (monotonic)."""
        with self.lock:
            return sum(1 for t in self.tries if t[0] <= when and (len(t) == 1 or t[1] > when))

    def stop(self) -> None:
        self._stop.set()
        self.sock.close()


@pytest.fixture
def dispatcher_for(
    sessions: sessionmaker[Session],
) -> Iterator[Callable[[Settings], Dispatcher]]:
    """Starts a dispatcher holding the supervisor lease, as the supervisor does."""
    started: list[tuple[Lease, Dispatcher]] = []

    def start(settings: Settings) -> Dispatcher:
        lease = Lease(sessions, ttl_s=6.0)
        assert lease.renew() and lease.held()
        lease.start()
        dispatcher = Dispatcher(settings, sessions, sessions, lease)
        dispatcher.start()
        started.append((lease, dispatcher))
        return dispatcher

    yield start
    for lease, dispatcher in started:
        dispatcher.stop()
        lease.stop()


@pytest.fixture
def healthy() -> Iterator[Healthy]:
    h = Healthy()
    yield h
    h.stop()


@pytest.fixture
def trickle() -> Iterator[Trickle]:
    t = Trickle()
    yield t
    t.stop()


def _settings(tmp_path: Path, endpoints: dict[str, str], **overrides: object) -> Settings:
    path = tmp_path / "webhooks.json"
    path.write_text(json.dumps({n: {"url": u, "secret": SECRET} for n, u in endpoints.items()}))
    return Settings(home=tmp_path / "home", cpu_slots=1, gpus="none", webhooks_file=path,
                    webhook_retry_first_s=60, **overrides)


def _ended_job(factory: sessionmaker[Session], endpoint: str) -> int:
    """A job subscribed to ``endpoint``'s ``succeeded``, which it then reached: one pending
    delivery in the outbox."""
    with factory() as s:
        job_id = repo.create_job(s, JobSpec.model_validate({"notify": [endpoint]}), None,
                                 {endpoint: ["succeeded"]}).id
        for state in (JobState.starting, JobState.running, JobState.succeeded):
            assert repo.transition(s, job_id, state)
        s.commit()
    return job_id


def _deliveries(factory: sessionmaker[Session], job_id: int) -> list[WebhookDelivery]:
    with factory() as s:
        rows = list(outbox.job_deliveries(s, job_id))
        s.expunge_all()
        return rows


def _await(predicate: Callable[[], object], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_a_trickling_receiver_fails_at_the_deadline_and_starves_no_one(
    tmp_path: Path, sessions: sessionmaker[Session], healthy: Healthy, trickle: Trickle,
    dispatcher_for,  # type: ignore[no-untyped-def]  # stopped first: set up last
) -> None:
    """Three senders, at most two per endpoint; a slow endpoint's three deliveries are due
    before the healthy one's. The healthy delivery goes out while two slow tries are in flight
    (the slow endpoint's share), no third slow try runs beside them, and each slow try ends at
    the try's deadline although bytes kept coming."""
    settings = _settings(tmp_path, {"slow": trickle.url, "ok": healthy.url},
                         webhook_timeout_s=DEADLINE_S, webhook_concurrency=3,
                         webhook_endpoint_concurrency=2)
    slow = [_ended_job(sessions, "slow") for _ in range(3)]
    ok = _ended_job(sessions, "ok")
    dispatcher_for(settings)

    healthy.wait_for((ok, "succeeded"), timeout_s=30)
    # Sent while slow tries are in flight: not starved behind them. One or both: the second
    # slow try's connection may be accepted after it on a loaded host (failed so once in CI,
    # 2026-12-08); that the slow endpoint never gets a third is asserted below.
    assert trickle.open_at(healthy.at[(ok, "succeeded")]) >= 1
    _await(lambda: [d.state for d in _deliveries(sessions, ok)] == ["delivered"],
           timeout_s=30, what="not recorded as delivered")

    def two_slow_tries_ended() -> bool:
        return sum(d.attempts for j in slow for d in _deliveries(sessions, j)) >= 2
    _await(two_slow_tries_ended, timeout_s=30, what="the slow tries never ended")
    tried = [d for j in slow for d in _deliveries(sessions, j) if d.attempts]
    assert all(d.state == "pending" and "deadline" in (d.last_error or "") for d in tried), [
        (d.state, d.last_error) for d in tried]
    with trickle.lock:
        tries = [list(t) for t in trickle.tries]
    ended = [t for t in tries if len(t) == 2]
    assert len(ended) >= 2, tries
    # Each try ended at the deadline, counted from before its connection was accepted.
    assert all(DEADLINE_S - 0.5 <= closed - accepted <= DEADLINE_S + 1 for accepted, closed in ended), ended
    assert max(trickle.open_at(t[0]) for t in tries) == 2  # never more than its share


@both_stores
def test_deleting_a_job_still_delivers_its_pending_webhooks(
    tmp_path: Path, sessions: sessionmaker[Session], healthy: Healthy,
    dispatcher_for,  # type: ignore[no-untyped-def]  # stopped first: set up last
) -> None:
    """Deleted before its ``succeeded`` was sent: the event still arrives, and the outbox row
    goes once it was delivered; one given up (its endpoint left the file) goes too; a deleted
    job's delivered rows go with the job."""
    settings = _settings(tmp_path, {"ok": healthy.url})
    cleanup = Cleanup(settings, sessions)
    pending = _ended_job(sessions, "ok")
    orphaned = _ended_job(sessions, "gone")  # subscribed while "gone" was in the file
    cleanup.delete(pending)
    cleanup.delete(orphaned)
    assert [d.state for d in _deliveries(sessions, pending)] == ["pending"]

    dispatcher_for(settings)
    healthy.wait_for((pending, "succeeded"))
    _await(lambda: not _deliveries(sessions, pending) and not _deliveries(sessions, orphaned),
           timeout_s=30, what="a deleted job's ended deliveries were kept")

    delivered = _ended_job(sessions, "ok")
    healthy.wait_for((delivered, "succeeded"))
    _await(lambda: [d.state for d in _deliveries(sessions, delivered)] == ["delivered"],
           timeout_s=30, what="not recorded as delivered")
    cleanup.delete(delivered)
    with sessions() as s:
        assert s.scalar(select(func.count()).select_from(WebhookDelivery)) == 0
    assert healthy.received.count((pending, "succeeded")) == 1
