"""Sending the webhook outbox: at least once, signed, retried for hours, off the loop.

Rows of ``webhook_deliveries`` are written by ``service.store.repository`` in the transaction of
the state change they tell of (the outbox). The :class:`Dispatcher` sends them:

* **Only the acting supervisor sends.** Each round starts with ``lease.held()``, and the outcome
  of a try is written under the lease's fence: a server that lost the lease writes nothing, and
  the next holder sends the row again (the same ``webhook-id``: receivers drop duplicates).
* **Never in the loop's way.** A thread of its own picks due rows every ``POLL_S`` and hands
  each to a pool of ``webhook_concurrency`` threads. The supervisor's tick never waits for a
  delivery.
* **No receiver holds a sender long.** A try has one deadline, ``webhook_timeout_s``, for
  connecting, sending and the whole answer (``service.domain.webhooks.sender``), not one per
  read: a receiver that trickles bytes fails at the deadline like one that hangs.
* **Fair between endpoints.** At most ``webhook_endpoint_concurrency`` tries of one endpoint
  are in flight at once (``_pick``): a slow or hanging endpoint holds at most that many senders,
  each until its deadline, and the others' deliveries go out meanwhile.
* **Retries** wait ``webhook_retry_first_s``, doubling each time up to
  ``webhook_retry_max_interval_s`` (plus up to 10 % jitter), until ``webhook_retry_for_s`` after
  the event: then the delivery is ``failed``. Any answer but a 2xx is a failure (redirects are
  not followed); so are a timeout and a refused connection.
* **Deleting a job does not drop its deliveries.** Pending ones are still sent; a delivery that
  ends (delivered or given up) after its job was deleted is removed then
  (``outbox.record_delivery_try``).
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
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from sqlalchemy.orm import Session, sessionmaker
from standardwebhooks.webhooks import Webhook

from service import __version__
from service.domain.lease import Lease
from service.domain.webhooks.sender import Outbound, Sender, SenderStopped
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
    # Deliveries being tried: id → endpoint.
    _inflight: dict[int, str] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _thread: threading.Thread | None = None
    _pool: ThreadPoolExecutor | None = None
    _sender: Sender | None = None

    def start(self) -> None:
        n = self.settings.webhook_concurrency
        self._sender = Sender(self.settings.webhook_timeout_s, max_connections=n)
        self._pool = ThreadPoolExecutor(max_workers=n, thread_name_prefix="torchyard-webhook")
        self._thread = threading.Thread(target=self._run, name="torchyard-webhooks", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop picking rows; tries in flight end at once with no outcome stored: their rows
        stay as they were, sent again by the next start or supervisor."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        if self._sender is not None:
            self._sender.close()

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
            busy = dict(self._inflight)
        if room <= 0:
            return 0
        with self.read_sessions() as session:
            due = self._pick(session, room, busy)
        if not due:
            return 0
        try:
            endpoints: dict[str, Endpoint] | None = read_endpoints(self.settings.webhooks_file)
        except WebhookConfigError as exc:  # edited into a broken file: try again later
            logger.error("webhooks: not sending: %s", exc)
            return 0
        for item in due:
            with self._lock:
                self._inflight[item.id] = item.endpoint
            self._pool.submit(self._try, item, endpoints.get(item.endpoint))
        return len(due)

    def _pick(self, session: Session, room: int, busy: dict[int, str]) -> list[Outgoing]:
        """Up to ``room`` due deliveries, oldest due first, leaving out those in flight
        (``busy``: id → endpoint) and any that would put more than
        ``webhook_endpoint_concurrency`` tries of one endpoint in flight. A query skips the
        endpoints already at their cap, so a backlog of one endpoint never hides another's
        due rows; each further query follows an endpoint reaching its cap (at most one per
        endpoint)."""
        cap = self.settings.webhook_endpoint_concurrency
        in_flight = Counter(busy.values())
        skip = set(busy)
        picked: list[Outgoing] = []
        now = utcnow()
        while room > 0:
            full = {e for e, n in in_flight.items() if n >= cap}
            capped = False
            for r in outbox.due_deliveries(session, now, room, skip, skip_endpoints=full):
                if in_flight[r.endpoint] >= cap:
                    capped = True
                    continue
                in_flight[r.endpoint] += 1
                skip.add(r.id)
                room -= 1
                picked.append(Outgoing(r.id, r.job_id, r.endpoint, r.event, r.webhook_id,
                                       r.body, r.created_at, r.attempts))
            if not capped:
                break
        return picked

    def _try(self, item: Outgoing, endpoint: Endpoint | None) -> None:
        try:
            self._send_and_record(item, endpoint)
        except SenderStopped:
            logger.info("job %s: webhook %s to %s: stopping, sent again later",
                        item.job_id, item.event, item.endpoint)
        except Exception as exc:
            level = logging.WARNING if is_busy(exc) else logging.ERROR
            logger.log(level, "job %s: webhook %s to %s: outcome not stored (sent again): %r",
                       item.job_id, item.event, item.endpoint, exc)
        finally:
            with self._lock:
                self._inflight.pop(item.id, None)
            self._wake.set()

    def _send_and_record(self, item: Outgoing, endpoint: Endpoint | None) -> None:
        now = datetime.now(UTC)
        status, error, give_up = None, None, False
        if endpoint is None:
            error, give_up = f"endpoint {item.endpoint!r} is no longer in {SETTING}", True
        elif self._sender is None:
            raise SenderStopped
        else:
            status, error = self._sender.post(build_request(item, endpoint, now))
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
