"""Told, not polling: commits wake the routes waiting on a job (in process, and on PostgreSQL
across processes through LISTEN/NOTIFY)."""

import asyncio
import threading
import time

import pytest
from fastapi.testclient import TestClient

from service.store import repository as repo
from service.store.changefeed import LISTENING_FALLBACK_S, ChangeFeed, note_change
from service.store.db import make_engine, make_session_factory
from tests.conftest import both_stores
from torchyard_contract.state import JobState

SMALL = {"dataset": "synthetic", "epochs": 1, "nproc_per_node": 1}


def test_a_publish_from_another_thread_wakes_a_waiter_at_once() -> None:
    feed = ChangeFeed()

    async def scenario() -> tuple[bool, float, bool]:
        seen = feed.version(7)
        threading.Timer(0.1, feed.publish, args=([7],)).start()
        started = time.monotonic()
        woke = await feed.wait(7, seen, timeout=10)
        elapsed = time.monotonic() - started
        # A change between the read and the wait is not missed: no sleep at all.
        already = await feed.wait(7, seen, timeout=10)
        return woke, elapsed, already

    woke, elapsed, already = asyncio.run(scenario())
    assert woke and already and elapsed < 0.5, elapsed


def test_other_jobs_and_timeouts_do_not_wake() -> None:
    feed = ChangeFeed()

    async def scenario() -> bool:
        waiter = asyncio.ensure_future(feed.wait(1, feed.version(1), timeout=0.3))
        while not feed.waiting(1):  # it waits now: another job's change comes while it does
            await asyncio.sleep(0.001)
        await asyncio.to_thread(feed.publish, [2])
        return await waiter

    assert asyncio.run(scenario()) is False
    assert feed.version(2) == 1 and feed.waiting(1) == 0


# A job id no job has: its changes are markers that every earlier commit was heard.
MARKER_JOB = 10**9


def _all_heard(api: TestClient) -> None:
    """Until this process's feed has heard everything committed before now: a change of
    ``MARKER_JOB`` is committed and awaited as told here and, on PostgreSQL, as heard back
    through ``LISTEN``. Notifications arrive in commit order, so an earlier commit's (or a
    rolled-back transaction's, had one been sent) would have arrived before it."""
    feed: ChangeFeed = api.app.state.changes
    before = feed.version(MARKER_JOB)
    with api.app.state.session_factory() as session:
        note_change(session, MARKER_JOB)
        session.commit()
    told = before + (2 if feed.listening else 1)  # here at once; through LISTEN on PostgreSQL
    deadline = time.monotonic() + 30
    while feed.version(MARKER_JOB) < told:
        assert time.monotonic() < deadline, "the marker's commit was never heard back"
        time.sleep(0.01)


@both_stores
def test_a_commit_tells_the_feed_and_a_rollback_does_not(api: TestClient) -> None:
    feed: ChangeFeed = api.app.state.changes
    job_id = api.post("/jobs", json=SMALL).json()["id"]
    _all_heard(api)  # on PostgreSQL the submit is heard back through LISTEN as well
    before = feed.version(job_id)
    with api.app.state.session_factory() as session:
        assert repo.transition(session, job_id, JobState.starting)
        session.rollback()
    _all_heard(api)  # a commit after the rollback was heard: the rollback would have been first
    assert feed.version(job_id) == before
    assert api.post(f"/jobs/{job_id}/cancel").json()["state"] == "cancelled"
    assert feed.version(job_id) > before


@pytest.mark.parametrize("store", ["postgresql"], indirect=True)
def test_a_commit_in_another_process_wakes_wait_through_listen_notify(
    api: TestClient, database_url: str
) -> None:
    """Another server's commit (here: its own engine and feed) reaches this one's long poll far
    sooner than its fallback re-read would."""
    feed: ChangeFeed = api.app.state.changes
    job_id = api.post("/jobs", json=SMALL).json()["id"]
    other_engine = make_engine(database_url)
    other = make_session_factory(other_engine, ChangeFeed())
    answer: dict[str, object] = {}

    def long_poll() -> None:
        started = time.monotonic()
        answer["job"] = api.get(f"/jobs/{job_id}/wait?timeout=20").json()
        answer["elapsed"] = time.monotonic() - started

    poller = threading.Thread(target=long_poll)
    poller.start()
    deadline = time.monotonic() + 30
    while not feed.waiting(job_id):  # the long poll read the job and waits to be told
        assert time.monotonic() < deadline, "the long poll never waited on the feed"
        time.sleep(0.01)
    committed = time.monotonic()
    with other() as session:
        assert repo.transition(session, job_id, JobState.cancelled, reason="from elsewhere")
        session.commit()
    poller.join(timeout=30)
    other_engine.dispose()
    assert answer["job"]["state"] == "cancelled"  # type: ignore[index]
    # Well inside the wait's fallback re-read (it just began): told, not found by re-reading.
    woke_after = time.monotonic() - committed
    assert woke_after < min(1.0, LISTENING_FALLBACK_S / 2), f"answered {woke_after:.2f} s after"
