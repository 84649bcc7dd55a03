"""``GET /audit``: the audit log (admin only), oldest first from a cursor. Nothing changes or
deletes it through the API (``service.api.middleware.audit`` appends)."""

from typing import Annotated

from fastapi import APIRouter, Query

from service.api.deps import SessionDep
from service.api.identityschemas import AuditPage, AuditRead
from service.store import audit

router = APIRouter(tags=["identity"])
AUDIT_PAGE_MAX = 1000


@router.get("/audit", response_model=AuditPage)
def read_audit(
    session: SessionDep,
    after: Annotated[int, Query(ge=0, le=2**63 - 1, description="entries with id > after")] = 0,
    actor: Annotated[str | None, Query(max_length=64, description="only this user's")] = None,
    limit: Annotated[int, Query(ge=1, le=AUDIT_PAGE_MAX)] = 100,
) -> AuditPage:
    """Entries oldest first; pass ``next_after`` as ``?after=`` for the next ones."""
    rows = audit.page(session, after, limit, actor)
    return AuditPage(items=[AuditRead.from_row(r) for r in rows],
                     next_after=rows[-1].id if rows else after)
