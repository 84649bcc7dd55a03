"""Webhooks (docs/webhooks.md): the outbox is written with the state change, sent signed by the
supervisor with retries, through a receiver that fails, is down across a server restart, and
across a leader failover; deliveries are visible through the API, secrets never.

The receiver is a local HTTP server in the test that verifies every request with the
``standardwebhooks`` package, as a pipeline's receiver would.
"""

import base64
import json
import signal
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from service.domain.webhooks.delivery import Outgoing, build_request
from service.settings.webhookfile import Endpoint
from service.store import outbox
from service.store import repository as repo
from service.store.tables import Job, WebhookDelivery
from tests.conftest import ADOPTS_ONLY, LiveServer, both_stores, leader_and_standby, reserve_port
from torchyard_contract.spec import JobSpec
from torchyard_contract.state import JobState

SECRET = "whsec_" + base64.b64encode(b"torchyard-test-secret-0123456789").decode()
QUICK = {"dataset": "synthetic", "synthetic_samples": 64, "epochs": 1, "nproc_per_node": 1}
# Retries a test can wait for: 0.2 s, 0.4 s, 0.8 s … capped at 1 s.
FAST_RETRIES = {"TORCHYARD_WEBHOOK_RETRY_FIRST_S": "0.2",
                "TORCHYARD_WEBHOOK_RETRY_MAX_INTERVAL_S": "1",
                "TORCHYARD_WEBHOOK_TIMEOUT_S": "2"}


class Receiver:
    """A webhook endpoint on 127.0.0.1: verifies each request; answers 500 to the first
    ``fail_first`` requests (verified or not), 401 to one that does not verify, else 204."""

    def __init__(self, port: int, fail_first: int = 0) -> None:
        self.port, self.fail_first = port, fail_first
        self.requests = 0
        self.received: list[dict] = []  # verified payloads with their webhook-id
        self.refused: list[str] = []
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def start(self) -> "Receiver":
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                code = receiver.take(body, dict(self.headers))
                self.send_response(code)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        class Server(ThreadingHTTPServer):
            allow_reuse_port = True  # beside the port's reservation (tests/fixtures/ports.py)

        self._server = Server(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def take(self, body: bytes, headers: dict[str, str]) -> int:
        with self.lock:
            self.requests += 1
            if self.requests <= self.fail_first:
                self.changed.notify_all()
                return 500
            try:
                payload = Webhook(SECRET).verify(body, headers)
            except WebhookVerificationError as exc:
                self.refused.append(str(exc))
                self.changed.notify_all()
                return 401
            lower = {k.lower(): v for k, v in headers.items()}
            self.received.append({**payload, "webhook_id": lower["webhook-id"]})
            self.changed.notify_all()
            return 204

    def events(self) -> dict[tuple[int, str], set[str]]:
        """(job id, event) → the webhook-ids it arrived under."""
        with self.lock:
            seen: dict[tuple[int, str], set[str]] = defaultdict(set)
            for p in self.received:
                seen[(p["data"]["job_id"], p["data"]["event"])].add(p["webhook_id"])
            return dict(seen)

    def wait_for(self, expected: set[tuple[int, str]], timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        with self.lock:
            while True:
                got = {(p["data"]["job_id"], p["data"]["event"]) for p in self.received}
                if expected <= got:
                    return
                left = deadline - time.monotonic()
                assert left > 0, f"missing {expected - got}; got {got}; refused {self.refused}"
                self.changed.wait(left)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver(reserve_port(), fail_first=2).start()
    yield r
    r.stop()


def _hooks_file(tmp_path: Path, url: str, **extra: dict) -> Path:
    path = tmp_path / "webhooks.json"
    path.write_text(json.dumps({"ci": {"url": url, "secret": SECRET}, **extra}))
    return path


def _submit(server: LiveServer, **spec: object) -> int:
    with server.client() as c:
        r = c.post("/jobs", json={**QUICK, **spec})
        assert r.status_code == 201, r.text
        return r.json()["id"]


def _deliveries(server: LiveServer, job_id: int) -> list[dict]:
    with server.client() as c:
        r = c.get(f"/jobs/{job_id}/deliveries")
        assert r.status_code == 200, r.text
        assert SECRET not in r.text and "127.0.0.1" not in r.text  # never the secret nor the URL
        return r.json()["items"]


def _wait_delivered(server: LiveServer, job_id: int, events: set[str], timeout_s: float = 30) -> list[dict]:
    deadline = time.monotonic() + timeout_s
    while True:
        items = _deliveries(server, job_id)
        if {i["event"] for i in items if i["state"] == "delivered"} >= events:
            return items
        assert time.monotonic() < deadline, f"not delivered: {items}"
        time.sleep(0.2)


@pytest.mark.slow
def test_every_state_change_arrives_signed_through_a_failing_receiver(
    live_server_factory, receiver: Receiver, tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    hooks = _hooks_file(tmp_path, receiver.url)
    # Rank 1 raises in every attempt: a 1-rank job succeeds, a 2-rank job restarts, then fails.
    server = live_server_factory(TORCHYARD_WEBHOOKS_FILE=str(hooks), TORCHYARD_TEST_FAIL_RANK="1",
                                 **FAST_RETRIES)
    with server.client() as c:
        r = c.post("/jobs", json={**QUICK, "notify": ["ci", "nope"]})
        assert r.status_code == 422
        assert "notify" in r.text and "'nope'" in r.text and "ci" in r.text
    ok = _submit(server, notify=["ci"])
    bad = _submit(server, notify=["ci"], nproc_per_node=2, max_restarts=1)
    long = _submit(server, notify=["ci"], epochs=100_000)
    silent = _submit(server)  # names no endpoint: nothing is sent for it
    server.wait_for(long, {"running"})
    with server.client() as c:
        assert c.post(f"/jobs/{long}/cancel").status_code == 200
    expected = {(ok, "running"), (ok, "succeeded"), (bad, "running"), (bad, "restarted"),
                (bad, "failed"), (long, "running"), (long, "cancelled")}
    for job_id, end in ((ok, "succeeded"), (bad, "failed"), (silent, "succeeded")):
        server.wait_for(job_id, {end}, timeout_s=240, allowed={"queued", "starting", "running", end})
    receiver.wait_for(expected)

    events = receiver.events()
    assert set(events) == expected  # nothing else: not the silent job, no duplicate event
    assert all(len(ids) == 1 for ids in events.values()), events  # one webhook-id per event
    assert receiver.requests >= len(expected) + 2 and not receiver.refused
    by_event = {(p["data"]["job_id"], p["data"]["event"]): p for p in receiver.received}
    failed = by_event[(bad, "failed")]
    assert failed["type"] == "job.failed" and "rank 1" in failed["data"]["reason"]
    assert by_event[(bad, "restarted")]["data"]["attempt"] == 2
    assert by_event[(ok, "succeeded")]["data"]["exit_code"] == 0
    # The API shows each delivery; the two refused tries were retried under the same id.
    items = [i for j in (ok, bad, long) for i in _wait_delivered(
        server, j, {e for (jj, e) in expected if jj == j})]
    assert len(items) == len(expected)
    assert sum(i["attempts"] for i in items) == receiver.requests
    retried = [i for i in items if i["attempts"] > 1]
    assert retried and all(i["last_status_code"] == 204 for i in items)
    assert {i["webhook_id"] for i in items} == {i for ids in events.values() for i in ids}
    assert _deliveries(server, silent) == []


@pytest.mark.slow
def test_a_receiver_down_across_a_server_restart_gets_every_event(
    live_server_factory, tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    receiver = Receiver(reserve_port())  # not listening yet: connections are refused
    hooks = _hooks_file(tmp_path, receiver.url)
    env = {"TORCHYARD_WEBHOOKS_FILE": str(hooks), **FAST_RETRIES}
    server = live_server_factory(**env)
    job = _submit(server, notify=["ci"])
    server.wait_for(job, {"succeeded"})
    deadline = time.monotonic() + 30
    while True:  # both events tried and retried while the receiver is down
        items = _deliveries(server, job)
        if len(items) == 2 and all(i["attempts"] >= 2 for i in items):
            break
        assert time.monotonic() < deadline, items
        time.sleep(0.2)
    assert {i["state"] for i in items} == {"pending"}
    assert all(i["last_status_code"] is None and i["last_error"] for i in items)
    server.proc.send_signal(signal.SIGKILL)  # nothing is flushed: the rows are what survives
    server.proc.wait()
    receiver.start()
    try:
        restarted = live_server_factory(server.home, server.port, **env, **ADOPTS_ONLY)
        receiver.wait_for({(job, "running"), (job, "succeeded")})
        items = _wait_delivered(restarted, job, {"running", "succeeded"})
        assert all(len(ids) == 1 for ids in receiver.events().values())
        assert {i["webhook_id"] for i in items} == {
            i for ids in receiver.events().values() for i in ids}
    finally:
        receiver.stop()


# --- the outbox in the store (no server) ---------------------------------------------------------


def _outbox(factory: sessionmaker[Session], job_id: int) -> list[tuple[str, str]]:
    with factory() as s:
        return [(d.event, d.endpoint) for d in outbox.job_deliveries(s, job_id)]


@both_stores
def test_the_outbox_row_commits_or_rolls_back_with_the_state_change(
    sessions: sessionmaker[Session],
) -> None:
    subscribed = {"ci": ["running", "failed", "restarted"], "chat": ["failed"]}
    with sessions() as s:
        job_id = repo.create_job(s, JobSpec.model_validate({"notify": ["ci"]}), None,
                                 subscribed).id
        other = repo.create_job(s, JobSpec.model_validate({})).id
        s.commit()
    with sessions() as s:
        assert repo.transition(s, job_id, JobState.starting)
        assert repo.transition(s, job_id, JobState.running)
        s.rollback()  # the state change did not happen: neither did its event
    assert _outbox(sessions, job_id) == []
    with sessions() as s:
        assert repo.transition(s, job_id, JobState.starting)
        assert repo.transition(s, job_id, JobState.running)
        repo.set_attempts(s, job_id, [{"number": 1}])
        repo.set_attempts(s, job_id, [{"number": 1, "reason": "rank 0 died"}, {"number": 2}])
        repo.set_attempts(s, job_id, [{"number": 1, "reason": "rank 0 died"}, {"number": 2}])
        assert not repo.transition(s, job_id, JobState.running)  # lost CAS: no event
        assert repo.transition(s, job_id, JobState.failed, reason="boom")
        assert repo.transition(s, other, JobState.cancelled)
        s.commit()
    assert _outbox(sessions, job_id) == [
        ("running", "ci"), ("restarted", "ci"), ("failed", "ci"), ("failed", "chat")]
    assert _outbox(sessions, other) == []
    with sessions() as s:
        rows = outbox.job_deliveries(s, job_id)
        restarted = json.loads(rows[1].body)["data"]
        assert restarted["attempt"] == 2 and restarted["previous_attempt_reason"] == "rank 0 died"
        assert json.loads(rows[2].body)["data"]["reason"] == "boom"
        assert rows[2].body == rows[3].body and rows[2].webhook_id != rows[3].webhook_id
        assert outbox.delete_finished_deliveries(s, job_id) == 0  # pending: kept to be sent
        s.commit()
        assert s.scalar(select(func.count()).select_from(WebhookDelivery)) == 4


def test_slack_format_is_one_signed_line() -> None:
    body = json.dumps({"type": "job.failed", "timestamp": "2026-01-01T00:00:00.000Z",
                       "data": {"job_id": 7, "name": "train", "event": "failed",
                                "reason": "rank 1 ran out of memory"}})
    item = Outgoing(1, 7, "chat", "failed", "msg_1", body, datetime.now(UTC), 0)
    now = datetime.now(UTC)
    standard = build_request(item, Endpoint("ci", "http://x/", SECRET), now)
    assert standard.body == body.encode()
    assert Webhook(SECRET).verify(standard.body, standard.headers)["data"]["job_id"] == 7
    slack = build_request(item, Endpoint("chat", "http://x/", SECRET, format="slack"), now)
    text = Webhook(SECRET).verify(slack.body, slack.headers)["text"]
    assert text == "torchyard job 7 (train): failed: rank 1 ran out of memory"
    assert slack.headers["webhook-id"] == standard.headers["webhook-id"] == "msg_1"
    assert SECRET not in repr(Endpoint("ci", "http://x/", SECRET))




@pytest.mark.slow
@pytest.mark.parametrize("store", ["postgresql"], indirect=True)
def test_a_receiver_down_across_a_leader_failover_gets_every_event(
    live_server_factory, tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    """Two servers on one PostgreSQL: the leader stores the events and fails to send them; it is
    SIGKILLed; the standby takes the lease and delivers them, under the same webhook-ids."""
    receiver = Receiver(reserve_port())  # down: connections are refused
    hooks = _hooks_file(tmp_path, receiver.url)
    leader, standby = leader_and_standby(live_server_factory, TORCHYARD_WEBHOOKS_FILE=str(hooks),
                            **FAST_RETRIES)
    job = _submit(leader, notify=["ci"])
    leader.wait_for(job, {"succeeded"}, timeout_s=120)
    deadline = time.monotonic() + 30
    while True:  # both events stored and tried by the leader
        items = _deliveries(standby, job)
        if len(items) == 2 and all(i["attempts"] >= 1 for i in items):
            break
        assert time.monotonic() < deadline, items
        time.sleep(0.2)
    ids = {i["webhook_id"] for i in items}
    leader.proc.send_signal(signal.SIGKILL)
    leader.proc.wait()
    receiver.start()
    try:
        receiver.wait_for({(job, "running"), (job, "succeeded")}, timeout_s=60)
        assert {i for got in receiver.events().values() for i in got} == ids
        _wait_delivered(standby, job, {"running", "succeeded"})
    finally:
        receiver.stop()


@both_stores
def test_a_pause_sends_paused_and_a_resumed_attempt_is_no_restart(
    sessions: sessionmaker[Session],
) -> None:
    subscribed = {"ci": ["running", "paused", "restarted"]}
    with sessions() as s:
        job_id = repo.create_job(s, JobSpec.model_validate({"notify": ["ci"]}), None,
                                 subscribed).id
        s.commit()
    with sessions() as s:
        assert repo.transition(s, job_id, JobState.starting)
        assert repo.transition(s, job_id, JobState.running)
        repo.set_attempts(s, job_id, [{"number": 1}])
        assert repo.transition(s, job_id, JobState.pausing)
        assert repo.transition(s, job_id, JobState.paused)
        assert repo.transition(s, job_id, JobState.queued)  # resumed
        assert repo.transition(s, job_id, JobState.starting)
        repo.set_attempts(s, job_id, [{"number": 1, "paused": True, "reason": "paused"},
                                      {"number": 2}])
        assert repo.transition(s, job_id, JobState.running)
        s.commit()
    assert _outbox(sessions, job_id) == [("running", "ci"), ("paused", "ci"), ("running", "ci")]
    with sessions() as s:
        assert s.get(Job, job_id).state_changes == 7
