"""``GET /usage``: who used what — slot-seconds from the slot usage account
(``service.store.usage``), grouped by team, user or job, inside a window; JSON, or CSV when
asked for (``Accept: text/csv``). Admins see everyone's; anyone else their team's."""

import csv
import io
import time
from datetime import UTC, datetime
from typing import Annotated, Literal

from fastapi import APIRouter, Header, Query, Response
from pydantic import BeforeValidator

from service.api.deps import CallerDep, SessionDep
from service.api.errors import ApiError
from service.api.usageschemas import UsageReport, UsageRow
from service.store import usage

router = APIRouter(tags=["scheduling"])
CSV_FIELDS = ("team", "user", "job_id", "slot_seconds", "jobs", "attempts")
_CSV = {200: {"content": {"text/csv": {"schema": {"type": "string"}}},
              "description": "the report; as CSV (one header line, then one line per row, "
              f"columns {', '.join(CSV_FIELDS)}) when Accept names text/csv"}}


def _not_a_number(value: object) -> object:
    # pydantic reads "1700000000" or "0.5" as a Unix time; the schema promises an RFC 3339
    # date-time (or a date), so a number is refused rather than read as 1970.
    if isinstance(value, str):
        try:
            float(value)
        except ValueError:
            return value
        raise ValueError("must be a date-time such as 2026-12-01T00:00Z or a date, not a number")
    return value


# A window's end: RFC 3339 (UTC unless it says) or a date, never a Unix time.
When = Annotated[datetime, BeforeValidator(_not_a_number)]


def _seconds(at: datetime | None) -> float | None:
    if at is None:
        return None
    return (at if at.tzinfo else at.replace(tzinfo=UTC)).timestamp()


@router.get("/usage", response_model=UsageReport, responses=_CSV)
def read_usage(
    session: SessionDep,
    caller: CallerDep,
    group_by: Annotated[Literal["team", "user", "job"], Query(
        description="one row per team, per (team, user) or per job")] = "team",
    since: Annotated[When | None, Query(
        description="from (UTC unless it says; a date is its midnight), before until; "
        "default: the start")] = None,
    until: Annotated[When | None, Query(
        description="to (UTC unless it says); default: now. Runs still holding slots count "
        "up to it")] = None,
    accept: Annotated[str | None, Header(include_in_schema=False)] = None,
) -> UsageReport | Response:
    """Slot-seconds used inside the window, each run clipped to it (queued and paused time is
    not counted: only time holding slots), with the distinct jobs and runs. Admins: every
    team's; others: their own team's."""
    start, end = _seconds(since), _seconds(until)
    end = end if end is not None else time.time()
    if start is not None and start >= end:
        raise ApiError(422, "invalid_request", "since: must be before until", details=[
            {"field": "since", "message": "must be before until"}])
    rows = usage.report(session, group_by, start if start is not None else 0.0, end,
                        team=caller.team, everyone=caller.admin)
    items = [UsageRow.of(r) for r in rows]
    if accept and "text/csv" in accept:
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(CSV_FIELDS)
        for item in items:
            writer.writerow(["" if (v := getattr(item, f)) is None else v for f in CSV_FIELDS])
        return Response(out.getvalue(), media_type="text/csv; charset=utf-8")
    return UsageReport(group_by=group_by, since=since, until=datetime.fromtimestamp(end, UTC),
                       items=items)
