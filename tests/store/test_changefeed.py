"""Told, not polling: commits wake the routes waiting on a job (in process, and on PostgreSQL
across processes through LISTEN/NOTIFY)."""

import asyncio
import threading
import time

import pytest
from fastapi.testclient import TestClient

from service.store import repository as repo
from service.store.changefeed import LISTENING_FALLBACK_S, ChangeFeed
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
        seen = feed.version(1)
        threading.Timer(0.05, feed.publish, args=([2],)).start()
        return await feed.wait(1, seen, timeout=0.3)

    assert asyncio.run(scenario()) is False


@both_stores
def test_a_commit_tells_the_feed_and_a_rollback_does_not(api: TestClient) -> None:
    feed: ChangeFeed = api.app.state.changes
    job_id = api.post("/jobs", json=SMALL).json()["id"]
    time.sleep(0.3)  # on PostgreSQL the submit is also heard back through LISTEN: let it land
    before = feed.version(job_id)
    with api.app.state.session_factory() as session:
        assert repo.transition(session, job_id, JobState.starting)
        session.rollback()
    time.sleep(0.3)
    assert feed.version(job_id) == before
    assert api.post(f"/jobs/{job_id}/cancel").json()["state"] == "cancelled"
    assert feed.version(job_id) > before


@pytest.mark.parametrize("store", ["postgresql"], indirect=True)
def test_a_commit_in_another_process_wakes_wait_through_listen_notify(
    api: TestClient, database_url: str
) -> None:
    """Another server's commit (here: its own engine and feed) reaches this one's long poll far
    sooner than its fallback re-read would."""
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
    time.sleep(LISTENING_FALLBACK_S + 0.5)  # past the first fallback re-read: a quiet wait now
    committed = time.monotonic()
    with other() as session:
        assert repo.transition(session, job_id, JobState.cancelled, reason="from elsewhere")
        session.commit()
    poller.join(timeout=30)
    other_engine.dispose()
    assert answer["job"]["state"] == "cancelled"  # type: ignore[index]
    woke_after = time.monotonic() - committed
    assert woke_after < 1.0, f"answered {woke_after:.2f} s after the commit"
