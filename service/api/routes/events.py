"""``GET /jobs/{id}/events``: a job's state changes and metric records as Server-Sent Events.

Events:

* ``state`` — data: the job (as ``GET /jobs/{id}``), sent first and whenever the state changed
  since the last one sent (queued → starting → running → terminal; a pause goes on to pausing →
  paused, a resume back to queued). A state that lasted less than one poll may be skipped; the
  terminal state is always sent, last.
* ``metric`` — data: one record, as an item of ``GET /jobs/{id}/metrics``, in ``seq`` order.

Every event's ``id`` is the cursor ``<seq>-<stage>``: the last record ``seq`` sent and the stage
of the last state sent: how many state changes the job had made then (its ``state_changes``; 0
queued, 1 starting, 2 running, 3 ended for a job never paused; -1 none yet, as when a stream
opened on a finished job sends its records before the terminal state). A client that reconnects
with ``Last-Event-ID`` gets only newer records and only a later state: no gap, no duplicate.
The stream ends once the job is terminal and every record has been sent, or when the server
shuts down (``service.api.drain``): a client then reconnects with ``Last-Event-ID``.

The database is read in short sessions on the thread pool; nothing is held across a wait, and
streams of one job that were woken together share one read (``service.api.hotreads``). A
commit that changes the job or adds its records wakes the stream at once (``service.store.changefeed``:
PostgreSQL ``LISTEN/NOTIFY``, or this process's own commits on SQLite); ``EVENTS_POLL_S`` is only
the fallback for writers in other processes on SQLite.

The route writes the stream itself (the wire format of ``fastapi.sse``, a ``: ping`` comment
after ``PING_S`` of silence): the events of one wake-up go out as one chunk. FastAPI's
generator streaming moves every event through a producer task, two memory streams and a
timeout scope; with 100 streams of one job that was most of the server's CPU per record
(docs/benchmarks.md §7).
"""

import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Annotated

from fastapi import APIRouter, Depends, Header, Request
from fastapi.responses import StreamingResponse
from fastapi.sse import KEEPALIVE_COMMENT
from pydantic_core import to_json
from sqlalchemy.orm import Session, sessionmaker

from service.api.deps import JobDep, get_changes, get_session_factory
from service.api.drain import draining
from service.api.hotreads import HotReads
from service.api.recordschemas import metric_item
from service.api.schemas import JobRead
from service.store import records as recordstore
from service.store import repository as repo
from torchyard_contract.state import TERMINAL_STATES

router = APIRouter(prefix="/jobs", tags=["events"])
EVENTS_POLL_S = 0.5
EVENTS_PAGE = 1000
PING_S = 15.0  # a comment after this much silence keeps proxies from closing the stream
# An event id of this stream, or empty (start from the beginning); blanks around it are ignored.
LAST_EVENT_ID_PATTERN = r"^[ \t]*(?:[0-9]{1,18}-(?:-1|[0-9]{1,9}))?[ \t]*$"
_CURSOR = re.compile(r"^([0-9]{1,18})-(-1|[0-9]{1,9})$")


@dataclass(frozen=True)
class Cursor:
    seq: int = 0
    stage: int = -1  # -1: no state sent yet

    @property
    def id(self) -> str:
        return f"{self.seq}-{self.stage}"


def _cursor(
    last_event_id: Annotated[
        str,  # not ``str | None``: a header is absent or a string, never null
        Header(
            alias="Last-Event-ID",
            pattern=LAST_EVENT_ID_PATTERN,
            description="resume after this event id ('<seq>-<stage>', as sent in 'id:')",
        ),
    ] = "",
) -> Cursor:
    match = _CURSOR.match(last_event_id.strip())
    return Cursor(int(match[1]), int(match[2])) if match else Cursor()


@dataclass(frozen=True)
class Tail:
    """What one wake-up of a job's streams reads: the job's state, the job as a ``state``
    event's data, and the next records, each already written as its event up to the stage of
    its id (shared by every stream)."""

    stage: int  # the job's state_changes
    ended: bool  # the job is terminal
    job_json: str
    records: list[tuple[int, str]]  # (seq, "event: metric\ndata: <record>\nid: <seq>-")


def _read_tail(factory: sessionmaker[Session], job_id: int, after: int) -> Tail:
    """The job, then the records after ``after``: state first, as ``GET /metrics`` reads them."""
    with factory() as session:
        row = repo.get_job(session, job_id)
        job = JobRead.from_row(row)  # type: ignore[arg-type]
        rows = recordstore.read_records(session, job_id, after, EVENTS_PAGE)
        records = [(r.seq, f"event: metric\ndata: {to_json(metric_item(r)).decode()}\n"  # type: ignore[arg-type]
                    f"id: {r.seq}-") for r in rows]
    return Tail(row.state_changes or 0, job.state in TERMINAL_STATES,  # type: ignore[union-attr]
                job.model_dump_json(), records)


class EventStream(StreamingResponse):
    """``text/event-stream`` written by the route (FastAPI treats a route declaring its
    ``EventSourceResponse`` as a generator of events, one by one)."""

    media_type = "text/event-stream"


def _state_event(cursor: Cursor, job_json: str) -> str:
    # The wire format of fastapi.sse.format_sse_event; the data is one line of JSON.
    return f"event: state\ndata: {job_json}\nid: {cursor.id}\n\n"


@router.get("/{job_id}/events", response_class=EventStream)
async def job_events(
    request: Request,
    found: JobDep,  # 404 before the stream starts (a dependency runs before the response)
    cursor: Annotated[Cursor, Depends(_cursor)],
) -> EventStream:
    """State and metric events of the job; resumable with ``Last-Event-ID`` (see module doc)."""
    # The headers fastapi.sse sends: no caching, and no buffering by a proxy (Nginx).
    return EventStream(_events(request, found.id, cursor),
                               headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


async def _events(request: Request, job_id: int, cursor: Cursor) -> AsyncIterator[bytes]:
    """The stream: each wake-up's events as one chunk (see the module doc)."""
    factory = get_session_factory(request)
    changes = get_changes(request)
    reads: HotReads = request.app.state.hot_reads
    stopping = draining(request)
    quiet_since = time.monotonic()
    while not stopping.is_set():
        seen = changes.version(job_id)
        tail: Tail = await reads.shared((job_id, cursor.seq, seen), _read_tail, factory, job_id,
                                        cursor.seq)
        stage = tail.stage
        events: list[str] = []
        # A live state goes out before the records read after it (a client sees "running"
        # before that attempt's epochs). The terminal state goes out only once a poll that saw
        # it found no new record, so it comes after every record.
        if cursor.stage < stage and not tail.ended:
            cursor = Cursor(cursor.seq, stage)
            events.append(_state_event(cursor, tail.job_json))
        if tail.records:
            suffix = f"{cursor.stage}\n\n"
            events += [record + suffix for _seq, record in tail.records]
            cursor = Cursor(tail.records[-1][0], cursor.stage)
        if tail.ended and cursor.stage < stage and not tail.records:
            cursor = Cursor(cursor.seq, stage)
            events.append(_state_event(cursor, tail.job_json))
        if events:
            yield "".join(events).encode()
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since >= PING_S:
            yield KEEPALIVE_COMMENT
            quiet_since = time.monotonic()
        if tail.ended and not tail.records:
            return
        if len(tail.records) < EVENTS_PAGE:
            await changes.wait(job_id, seen, changes.fallback_s(EVENTS_POLL_S))
