"""The supervisor lease on both stores: one holder, takeover after expiry, fencing, release."""

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from service.domain.lease import MARGIN_S, Lease
from service.store import lease as leaserepo
from service.store.db import make_engine, make_session_factory, upgrade
from tests.conftest import both_stores

pytestmark = both_stores
TTL_S = 2.0


@pytest.fixture
def factory(tmp_path: Path, database_url: str | None) -> Iterator[sessionmaker[Session]]:
    url = database_url or f"sqlite:///{tmp_path / 'lease.db'}"
    upgrade(url)
    engine = make_engine(url)
    yield make_session_factory(engine)
    engine.dispose()


def test_one_holder_and_a_takeover_only_after_expiry(factory: sessionmaker[Session]) -> None:
    now = [0.0]  # a's clock, moved by hand: its own deadline is tested apart from the database's
    a = Lease(factory, TTL_S, owner="a", clock=lambda: now[0])
    b = Lease(factory, TTL_S, owner="b")
    assert a.renew() and a.held() and a.generation == 1
    assert not b.renew() and not b.held()
    renewed = time.monotonic()
    assert a.renew() and a.generation == 1  # a renewal keeps the generation
    # a stops renewing (paused, cut off): it stops acting MARGIN_S before its lease expires...
    now[0] = TTL_S - MARGIN_S - 0.01
    assert a.held()
    now[0] = TTL_S - MARGIN_S
    assert not a.held()
    # ... and b takes over only once the database says the lease expired.
    assert not b.renew(), "taken over before the holder's lease expired"
    deadline = time.monotonic() + TTL_S + 10
    while not b.renew():
        assert time.monotonic() < deadline, "never taken over"
        time.sleep(0.05)
    assert time.monotonic() - renewed >= TTL_S - 0.05, "taken over before the lease's TTL"
    assert b.held() and b.generation == 2
    assert not a.renew() and not a.held()
    with factory() as s:
        row = leaserepo.lease_row(s)
        assert row is not None and (row.owner, row.generation) == ("b", 2)


def test_a_deposed_holder_cannot_write_under_the_fence(factory: sessionmaker[Session]) -> None:
    """Even a holder whose own clock still says "held" (a stalled process) is refused by the
    database once another server holds the lease."""
    frozen = Lease(factory, TTL_S, owner="a", clock=lambda: 0.0)
    assert frozen.renew()
    with factory() as s:
        assert frozen.fence(s)
        s.rollback()
    b = Lease(factory, TTL_S, owner="b")
    deadline = time.monotonic() + TTL_S + 10
    while not b.renew():  # once the frozen one's lease expired in the database
        assert time.monotonic() < deadline, "never taken over"
        time.sleep(0.05)
    assert frozen.held()  # its clock stopped; the database is the judge
    with factory() as s:
        assert not frozen.fence(s)
        assert b.fence(s)


def test_release_hands_over_at_once(factory: sessionmaker[Session]) -> None:
    a, b = Lease(factory, TTL_S, owner="a"), Lease(factory, TTL_S, owner="b")
    a.start()
    deadline = time.monotonic() + 5
    while not a.held():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert not b.renew()
    a.stop(release=True)
    assert not a.held()
    assert b.renew() and b.generation == 2
