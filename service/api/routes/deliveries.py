"""``GET /jobs/{id}/deliveries``: the job's webhook deliveries, as the outbox holds them.

Names the endpoint, never its URL or secret (both stay in the server's webhooks file).
"""


from fastapi import APIRouter
from pydantic import BaseModel, Field

from service.api.deps import JobDep, SessionDep
from service.api.schemas import UtcDatetime
from service.store import outbox
from torchyard_contract.state import DeliveryStateName, WebhookEventName

router = APIRouter(prefix="/jobs", tags=["jobs"])


class DeliveryRead(BaseModel):
    """One event told to one endpoint (service.domain.webhooks.delivery); times are UTC."""

    event: WebhookEventName
    endpoint: str = Field(description="the endpoint's name in TORCHYARD_WEBHOOKS_FILE")
    webhook_id: str = Field(description="the webhook-id header, the same on every try")
    state: DeliveryStateName = Field(
        description="pending: not yet answered with a 2xx (retried with backoff); delivered; "
        "failed: given up after TORCHYARD_WEBHOOK_RETRY_FOR_S"
    )
    attempts: int = Field(description="tries so far")
    last_status_code: int | None = Field(description="HTTP status of the last try; null when "
                                         "none answered (a timeout, a refused connection)")
    last_error: str | None = Field(description="why the last try failed; null when it did not")
    created_at: UtcDatetime = Field(description="when the event happened")
    last_attempt_at: UtcDatetime | None
    next_attempt_at: UtcDatetime | None = Field(description="pending: when it is tried next")
    delivered_at: UtcDatetime | None


class DeliveryList(BaseModel):
    items: list[DeliveryRead]


@router.get("/{job_id}/deliveries", response_model=DeliveryList)
def list_deliveries(job: JobDep, session: SessionDep) -> DeliveryList:
    """The job's webhook deliveries in the order their events happened."""
    rows = outbox.job_deliveries(session, job.id)
    return DeliveryList(items=[
        DeliveryRead(
            event=r.event, endpoint=r.endpoint, webhook_id=r.webhook_id, state=r.state,
            attempts=r.attempts, last_status_code=r.last_status_code, last_error=r.last_error,
            created_at=r.created_at, last_attempt_at=r.last_attempt_at,
            next_attempt_at=r.next_attempt_at if r.state == outbox.DELIVERY_PENDING else None,
            delivered_at=r.delivered_at,
        )
        for r in rows
    ])
