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
    a, b = Lease(factory, TTL_S, owner="a"), Lease(factory, TTL_S, owner="b")
    assert a.renew() and a.held() and a.generation == 1
    assert not b.renew() and not b.held()
    assert a.renew() and a.generation == 1  # a renewal keeps the generation
    # a stops renewing (paused, cut off): it stops acting first, then b may take over.
    time.sleep(TTL_S - MARGIN_S + 0.05)
    assert not a.held()
    assert not b.renew(), "taken over before the holder's lease expired"
    time.sleep(MARGIN_S + 0.1)
    assert b.renew() and b.held() and b.generation == 2
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
    time.sleep(TTL_S + 0.1)
    b = Lease(factory, TTL_S, owner="b")
    assert b.renew()
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
