"""The webhook outbox in SQL: a delivery row per subscribed endpoint, written in the same
transaction as the state change it tells of (``repository.transition``), sent and retried by
``service.domain.webhooks.delivery``.

A job's pending deliveries outlive the job (``DELETE /jobs/{id}``, retention): deleting it
removes only its finished ones (:func:`delete_finished_deliveries`), and a pending one is
removed when its last try ends (:func:`record_delivery_try`). ``job_id`` is no foreign key for
that reason; job ids are never reused, so it never names a later job.
"""

import json
import uuid
from collections.abc import Iterable, Sequence
from datetime import datetime

from sqlalchemy import delete, exists, func, select, update
from sqlalchemy.orm import Session

from service.store.clock import utcnow
from service.store.tables import Job, WebhookDelivery
from torchyard_contract.bounds import bounded_text
from torchyard_contract.state import DeliveryState, WebhookEvent

DELIVERY_PENDING, DELIVERY_DELIVERED, DELIVERY_FAILED = (
    DeliveryState.pending.value, DeliveryState.delivered.value, DeliveryState.failed.value)


WEBHOOK_EVENTS = frozenset(e.value for e in WebhookEvent)


def queue_webhook(
    session: Session, job_id: int, name: str, webhooks: dict, event: str, data: dict
) -> None:
    """One outbox row per subscribed endpoint whose events include ``event``; the body is the
    Standard Webhooks JSON payload (``type``, ``timestamp``, ``data``), fixed now and sent byte
    for byte on every try under one ``webhook-id``."""
    endpoints = [e for e, events in webhooks.items() if event in (events or ())]
    if not endpoints:
        return
    now = utcnow()
    body = json.dumps({
        "type": f"job.{event}",
        "timestamp": now.isoformat(timespec="milliseconds") + "Z",
        "data": {"job_id": job_id, "name": name, "event": event, **data},
    }, separators=(",", ":"))
    session.add_all(
        WebhookDelivery(
            job_id=job_id, endpoint=endpoint, event=event, webhook_id=f"msg_{uuid.uuid4().hex}",
            body=body, created_at=now, state=DELIVERY_PENDING, attempts=0, next_attempt_at=now,
        )
        for endpoint in endpoints
    )
    session.flush()


def due_deliveries(
    session: Session, now: datetime, limit: int, skip: Iterable[int] = (),
    skip_endpoints: Iterable[str] = (),
) -> Sequence[WebhookDelivery]:
    """Pending deliveries whose next try is due, oldest due first, at most ``limit``, leaving
    out ``skip`` (those being sent) and those of ``skip_endpoints``; an index range scan
    (state, next_attempt_at)."""
    q = select(WebhookDelivery).where(
        WebhookDelivery.state == DELIVERY_PENDING, WebhookDelivery.next_attempt_at <= now
    )
    skip = list(skip)
    if skip:
        q = q.where(WebhookDelivery.id.not_in(skip))
    skip_endpoints = list(skip_endpoints)
    if skip_endpoints:
        q = q.where(WebhookDelivery.endpoint.not_in(skip_endpoints))
    return session.scalars(q.order_by(WebhookDelivery.next_attempt_at).limit(limit)).all()


def next_delivery_due(session: Session) -> datetime | None:
    """When the earliest pending delivery is due, or None when none is pending."""
    q = select(func.min(WebhookDelivery.next_attempt_at)).where(
        WebhookDelivery.state == DELIVERY_PENDING
    )
    return session.scalar(q)


def record_delivery_try(
    session: Session, delivery_id: int, at: datetime, status_code: int | None,
    error: str | None, next_at: datetime | None,
) -> None:
    """One try of a pending delivery: delivered (``error`` None), retried at ``next_at``, or
    given up (``next_at`` None). A delivery no longer pending (another supervisor's try) keeps
    its outcome. One that ended for a job deleted meanwhile is removed: it was kept only to be
    sent. (A job deleted in the same instant on PostgreSQL may leave such a row behind: it names
    a job id that never comes back, and nothing reads it.)"""
    values: dict[str, object] = {
        "attempts": WebhookDelivery.attempts + 1, "last_attempt_at": at,
        "last_status_code": status_code,
        "last_error": bounded_text(error) if error else None,
    }
    if error is None:
        values.update(state=DELIVERY_DELIVERED, delivered_at=at)
    elif next_at is None:
        values.update(state=DELIVERY_FAILED)
    else:
        values.update(next_attempt_at=next_at)
    session.execute(
        update(WebhookDelivery)
        .where(WebhookDelivery.id == delivery_id, WebhookDelivery.state == DELIVERY_PENDING)
        .values(**values)
    )
    if error is None or next_at is None:
        session.execute(
            delete(WebhookDelivery).where(
                WebhookDelivery.id == delivery_id,
                WebhookDelivery.state != DELIVERY_PENDING,
                ~exists().where(Job.id == WebhookDelivery.job_id),
            )
        )


def job_deliveries(session: Session, job_id: int) -> Sequence[WebhookDelivery]:
    """A job's webhook deliveries in the order their events happened."""
    q = select(WebhookDelivery).where(WebhookDelivery.job_id == job_id)
    return session.scalars(q.order_by(WebhookDelivery.id)).all()


def delete_finished_deliveries(session: Session, job_id: int) -> int:
    """Remove a job's delivered and failed deliveries, for deleting the job; its pending ones
    stay, to be sent (module docstring). Rows removed."""
    result = session.execute(delete(WebhookDelivery).where(
        WebhookDelivery.job_id == job_id, WebhookDelivery.state != DELIVERY_PENDING))
    return int(result.rowcount or 0)  # type: ignore[attr-defined]
