"""Sending the webhook outbox: at least once, signed, retried for hours, off the loop.

Rows of ``webhook_deliveries`` are written by ``service.store.repository`` in the transaction of
the state change they tell of (the outbox). The :class:`Dispatcher` sends them:

* **Only the acting supervisor sends.** Each round starts with ``lease.held()``, and the outcome
  of a try is written under the lease's fence: a server that lost the lease writes nothing, and
  the next holder sends the row again (the same ``webhook-id``: receivers drop duplicates).
* **Never in the loop's way.** A thread of its own picks due rows every ``POLL_S`` and hands
  each to a pool of ``webhook_concurrency`` threads; a receiver that hangs holds one of them
  for at most ``webhook_timeout_s``. The supervisor's tick never waits for a delivery.
* **Retries** wait ``webhook_retry_first_s``, doubling each time up to
  ``webhook_retry_max_interval_s`` (plus up to 10 % jitter), until ``webhook_retry_for_s`` after
  the event: then the delivery is ``failed``. Any answer but a 2xx is a failure (redirects are
  not followed); so are a timeout and a refused connection.
* **Standard Webhooks.** The body is the stored JSON, byte for byte; the headers are
  ``webhook-id`` (the row's, stable across tries), ``webhook-timestamp`` (this try's) and
  ``webhook-signature`` (``v1,`` HMAC-SHA256 by the ``standardwebhooks`` package). An endpoint
  with ``"format": "slack"`` gets ``{"text": …}`` instead, signed the same way.

Survives a restart and a failover: everything it needs is in the database; a try whose outcome
was not written (a crash, a lost lease) is sent again.
"""

import json
import logging
import random
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import httpx
from sqlalchemy.orm import Session, sessionmaker
from standardwebhooks.webhooks import Webhook

from service import __version__
from service.domain.lease import Lease
from service.settings import Settings
from service.settings.webhookfile import SETTING, Endpoint, WebhookConfigError, read_endpoints
from service.store import outbox
from service.store.db import is_busy

logger = logging.getLogger(__name__)

# How often the sender looks for due deliveries (it is also woken when a try ends).
POLL_S = 0.2
# How often the outbox is read when no webhooks file is set.
UNCONFIGURED_POLL_S = 10.0
JITTER = 0.1


@dataclass(frozen=True)
class Outgoing:
    """A due delivery, detached from its session."""

    id: int
    job_id: int
    endpoint: str
    event: str
    webhook_id: str
    body: str
    created_at: datetime
    attempts: int


@dataclass(frozen=True)
class Outbound:
    """What goes on the wire for one try: the body and the Standard Webhooks headers."""

    url: str
    body: bytes
    headers: dict[str, str]


def build_request(item: Outgoing, endpoint: Endpoint, now: datetime) -> Outbound:
    """The body (the stored one, or a Slack line) and its signed headers, for a try at ``now``."""
    body = item.body if endpoint.format == "standard" else slack_body(item.body)
    signature = Webhook(endpoint.secret).sign(item.webhook_id, now, body)
    headers = {
        "content-type": "application/json",
        "user-agent": f"torchyard/{__version__}",
        "webhook-id": item.webhook_id,
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": signature,
    }
    return Outbound(endpoint.url, body.encode(), headers)


def slack_body(body: str) -> str:
    """A one-line chat message (``{"text": …}``) from a stored Standard Webhooks body."""
    data = json.loads(body).get("data", {})
    line = f"torchyard job {data.get('job_id')} ({data.get('name')}): {data.get('event')}"
    if data.get("event") == "restarted":
        line += f", attempt {data.get('attempt')}"
        if data.get("previous_attempt_reason"):
            line += f" after: {data['previous_attempt_reason']}"
    elif data.get("reason"):
        line += f": {data['reason']}"
    return json.dumps({"text": line})


def retry_delay_s(settings: Settings, tries: int) -> float:
    """Wait before the next try after ``tries`` failed ones: doubling, capped, jittered."""
    base = settings.webhook_retry_first_s * 2 ** min(tries - 1, 40)
    return min(base, settings.webhook_retry_max_interval_s) * (1 + JITTER * random.random())


def utcnow() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


@dataclass
class Dispatcher:
    settings: Settings
    # Writers with a short lock wait (the loop's): a busy database only delays an outcome.
    sessions: sessionmaker[Session]
    read_sessions: sessionmaker[Session]
    lease: Lease
    _stop: threading.Event = field(default_factory=threading.Event)
    _wake: threading.Event = field(default_factory=threading.Event)
    _inflight: set[int] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _thread: threading.Thread | None = None
    _pool: ThreadPoolExecutor | None = None
    _client: httpx.Client | None = None

    def start(self) -> None:
        n = self.settings.webhook_concurrency
        self._pool = ThreadPoolExecutor(max_workers=n, thread_name_prefix="torchyard-webhook")
        self._thread = threading.Thread(target=self._run, name="torchyard-webhooks", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop picking rows; tries in flight end within ``webhook_timeout_s`` and their rows
        stay pending until written (the next start sends them again)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()

    def wake(self) -> None:
        self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.send_due()
            except Exception as exc:  # nothing may end the thread
                if is_busy(exc):
                    logger.warning("webhooks: database busy, trying again: %s",
                                   getattr(exc, "orig", exc))
                else:
                    logger.exception("webhooks: a round failed")
            # Without a webhooks file nothing new is queued; the slow poll only gives up rows
            # left from an earlier configuration (their endpoint is gone).
            self._wake.wait(POLL_S if self.settings.webhooks_file is not None else UNCONFIGURED_POLL_S)
            self._wake.clear()

    def send_due(self) -> int:
        """Hand the due deliveries to the pool, as many as it has room for; returns how many.
        Only while this process supervises."""
        if not self.lease.held() or self._pool is None:
            return 0
        with self._lock:
            room = self.settings.webhook_concurrency - len(self._inflight)
            busy = set(self._inflight)
        if room <= 0:
            return 0
        with self.read_sessions() as session:
            rows = outbox.due_deliveries(session, utcnow(), room, busy)
            due = [Outgoing(r.id, r.job_id, r.endpoint, r.event, r.webhook_id, r.body,
                            r.created_at, r.attempts) for r in rows]
        if not due:
            return 0
        try:
            endpoints: dict[str, Endpoint] | None = read_endpoints(self.settings.webhooks_file)
        except WebhookConfigError as exc:  # edited into a broken file: try again later
            logger.error("webhooks: not sending: %s", exc)
            return 0
        for item in due:
            with self._lock:
                self._inflight.add(item.id)
            self._pool.submit(self._try, item, endpoints.get(item.endpoint))
        return len(due)

    def _try(self, item: Outgoing, endpoint: Endpoint | None) -> None:
        try:
            self._send_and_record(item, endpoint)
        except Exception as exc:
            level = logging.WARNING if is_busy(exc) else logging.ERROR
            logger.log(level, "job %s: webhook %s to %s: outcome not stored (sent again): %r",
                       item.job_id, item.event, item.endpoint, exc)
        finally:
            with self._lock:
                self._inflight.discard(item.id)
            self._wake.set()

    def _send_and_record(self, item: Outgoing, endpoint: Endpoint | None) -> None:
        now = datetime.now(UTC)
        status, error, give_up = None, None, False
        if endpoint is None:
            error, give_up = f"endpoint {item.endpoint!r} is no longer in {SETTING}", True
        else:
            status, error = self._post(build_request(item, endpoint, now))
        at = now.replace(tzinfo=None)
        next_at = None
        if error is not None and not give_up:
            tries = item.attempts + 1
            candidate = at + timedelta(seconds=retry_delay_s(self.settings, tries))
            deadline = item.created_at + timedelta(seconds=self.settings.webhook_retry_for_s)
            next_at = candidate if candidate <= deadline else None
        if error is None:
            logger.info("job %s: webhook %s delivered to %s (%s)",
                        item.job_id, item.event, item.endpoint, status)
        else:
            logger.warning("job %s: webhook %s to %s failed (try %d): %s%s", item.job_id,
                           item.event, item.endpoint, item.attempts + 1, error,
                           "" if next_at else "; given up")
        with self.sessions() as session:
            if not self.lease.fence(session):
                return  # deposed: the next supervisor sends it again
            outbox.record_delivery_try(session, item.id, at, status, error, next_at)
            session.commit()

    def _http_client(self) -> httpx.Client | None:
        """The senders' client, built for the first delivery: most servers send none, and its
        TLS context (certifi's CA bundle) cost ~40 ms of CPU at every start. None once stopped."""
        with self._lock:
            if self._client is None and not self._stop.is_set():
                n = self.settings.webhook_concurrency
                self._client = httpx.Client(
                    timeout=httpx.Timeout(self.settings.webhook_timeout_s),
                    limits=httpx.Limits(max_connections=n, max_keepalive_connections=n),
                    follow_redirects=False,
                )
            return self._client

    def _post(self, request: Outbound) -> tuple[int | None, str | None]:
        """(status code, error): error None for a 2xx. The response body is never read."""
        client = self._http_client()
        if client is None:
            return None, "the sender is stopped"
        try:
            with client.stream("POST", request.url, content=request.body,
                                     headers=request.headers) as response:
                code = response.status_code
        except httpx.TimeoutException:
            return None, f"no answer within {self.settings.webhook_timeout_s:g}s"
        except httpx.HTTPError as exc:
            # The exception's class only: its text may quote the URL (a token in its path).
            return None, f"could not reach the endpoint ({type(exc).__name__})"
        if 200 <= code < 300:
            return code, None
        return code, f"answered HTTP {code}"
