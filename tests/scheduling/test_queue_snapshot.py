"""The queue snapshot on both stores: the supervisor publishes its scheduling result once per
change, under the lease; other processes read it at most once a second; a deposed supervisor
cannot overwrite it."""

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, event
from sqlalchemy.orm import Session, sessionmaker

from service.domain.lease import Lease
from service.domain.loop.supervisor import Supervisor
from service.domain.queue.inventory import make_inventory
from service.domain.queue.scheduler import Waiting
from service.domain.queue.snapshot import MAX_AGE_S, PUBLISH_MIN_S, SnapshotReader, decode, encode
from service.executor.local import LocalExecutor
from service.settings import Settings
from service.store import queue as queuerepo
from service.store.db import make_engine, make_session_factory, upgrade
from tests.conftest import both_stores

TTL_S = 2.0
BEHIND = "needs 1 CPU slot; 0 free, behind job 3"


@pytest.fixture
def url(tmp_path: Path, database_url: str | None) -> str:
    url = database_url or f"sqlite:///{tmp_path / 'home' / 'q.db'}"
    upgrade(url)
    return url


@pytest.fixture
def engines(url: str) -> Iterator[tuple[Engine, Engine]]:
    writer, reader = make_engine(url), make_engine(url, readonly=True)
    yield writer, reader
    writer.dispose()
    reader.dispose()


def _supervisor(
    tmp_path: Path, url: str, engines: tuple[Engine, Engine], lease: Lease,
    clock: Callable[[], float] = time.monotonic,
) -> Supervisor:
    settings = Settings(home=tmp_path / "home", cpu_slots=1, gpus="none", database_url=url)
    return Supervisor(
        settings=settings,
        session_factory=make_session_factory(engines[0]),
        read_session_factory=make_session_factory(engines[1]),
        inventory=make_inventory("none", 1),
        executor=LocalExecutor(),
        lease=lease,
        clock=clock,
    )


def _lead(supervisor: Supervisor) -> None:
    """Take the lease and start a term (recovery of an empty database), without the loop."""
    assert supervisor.lease is not None and supervisor.lease.renew()
    assert supervisor._lead() and supervisor.acting


def _version(factory: sessionmaker[Session]) -> int | None:
    with factory() as session:
        return queuerepo.snapshot_version(session)


def test_encoding_round_trips_and_names_each_reason_once() -> None:
    waiting = {7: Waiting(1, "needs 2 CPU slots; 1 free"), 9: Waiting(2, BEHIND),
               11: Waiting(3, BEHIND)}
    text = encode(waiting)
    assert decode(text) == waiting
    assert text.count(BEHIND) == 1
    assert decode(encode({})) == {}
    assert decode("{}") == {}  # the row as the migration leaves it
    assert decode("not json") == {} and decode('{"jobs": [[1, 1, 5]], "reasons": []}') == {}


@both_stores
def test_published_once_per_change_and_read_by_a_standby(
    tmp_path: Path, url: str, engines: tuple[Engine, Engine]
) -> None:
    now = [100.0]  # both supervisors' clock for the snapshot, moved by hand

    def clock() -> float:
        return now[0]

    # A long lease: no renewal thread runs here.
    leader = _supervisor(tmp_path, url, engines, Lease(make_session_factory(engines[0]), 60,
                                                       owner="a"), clock)
    standby = _supervisor(tmp_path, url, engines, Lease(make_session_factory(engines[0]), 60,
                                                        owner="b"), clock)
    factory = make_session_factory(engines[1])
    assert standby.queue_status(5) is None and _version(factory) == 0  # the migration's empty row
    _lead(leader)

    first = {5: Waiting(1, "needs 1 CPU slot; 0 free"), 6: Waiting(2, BEHIND)}
    leader._set_waiting(first)
    assert leader.queue_status(5) == first[5]  # the leader answers from memory at once
    leader._publish_waiting()
    assert _version(factory) == 1
    now[0] += MAX_AGE_S - 0.01
    assert standby.queue_status(5) is None  # what it read at first, kept for MAX_AGE_S
    now[0] += 0.01
    assert standby.queue_status(5) == first[5] and standby.queue_status(6) == first[6]
    assert standby.queue_status(4) is None

    # An equal result (a new pass that changed nothing) is not written again.
    now[0] += PUBLISH_MIN_S
    leader._set_waiting(dict(first))
    leader._publish_waiting()
    assert _version(factory) == 1

    # A changed one is; the next change not sooner than PUBLISH_MIN_S after that write.
    second = {6: Waiting(1, "needs 1 CPU slot; 0 free")}
    leader._set_waiting(second)
    leader._publish_waiting()
    assert _version(factory) == 2
    leader._set_waiting({})
    now[0] += PUBLISH_MIN_S - 0.01
    leader._publish_waiting()
    assert _version(factory) == 2 and SnapshotReader(factory).current() == second
    now[0] += 0.01
    leader._publish_waiting()  # the next tick
    assert _version(factory) == 3 and SnapshotReader(factory).current() == {}


@both_stores
def test_a_deposed_supervisor_cannot_overwrite_the_snapshot(
    tmp_path: Path, url: str, engines: tuple[Engine, Engine]
) -> None:
    """A stalled leader whose own clock still says "held" is refused by the database."""
    stalled = _supervisor(tmp_path, url, engines, Lease(make_session_factory(engines[0]), TTL_S,
                                                        owner="a", clock=lambda: 0.0))
    _lead(stalled)
    successor = _supervisor(tmp_path, url, engines, Lease(make_session_factory(engines[0]),
                                                          TTL_S, owner="b"))
    deadline = time.monotonic() + TTL_S + 10
    while not successor.lease.renew():  # once the stalled one's lease expired in the database
        assert time.monotonic() < deadline, "never taken over"
        time.sleep(0.05)
    assert successor._lead() and successor.acting
    current = {5: Waiting(1, "needs 1 CPU slot; 0 free")}
    successor._set_waiting(current)
    successor._publish_waiting()

    assert stalled.acting  # its clock stopped
    stalled._set_waiting({5: Waiting(9, "stale")})
    stalled._publish_waiting()
    factory = make_session_factory(engines[1])
    assert _version(factory) == 1
    assert SnapshotReader(factory).current() == current


@both_stores
def test_a_reader_asks_the_database_at_most_once_per_max_age(
    url: str, engines: tuple[Engine, Engine]
) -> None:
    writes = make_session_factory(engines[0])
    with writes() as session:
        queuerepo.write_snapshot(session, encode({5: Waiting(1, "a"), 6: Waiting(2, "a")}))
        session.commit()
    statements: list[str] = []
    event.listen(engines[1], "before_cursor_execute",
                 lambda _c, _cur, sql, *_a: statements.append(sql))
    now = [100.0]
    reader = SnapshotReader(make_session_factory(engines[1]), clock=lambda: now[0])
    for _ in range(50):  # one page of GET /jobs
        assert reader.get(5) == Waiting(1, "a")
    asked = [s for s in statements if "queue_snapshot" in s]
    assert len(asked) == 2, asked  # the version, then the text it had not read yet

    with writes() as session:
        queuerepo.write_snapshot(session, encode({6: Waiting(1, "b")}))
        session.commit()
    now[0] += 0.9
    assert reader.get(5) == Waiting(1, "a")  # still within the second: no query
    assert len([s for s in statements if "queue_snapshot" in s]) == 2
    now[0] += 0.1
    assert reader.get(5) is None and reader.get(6) == Waiting(1, "b")
    now[0] += 1.0
    reader.get(6)  # unchanged version: only the version is asked for
    asked = [s for s in statements if "queue_snapshot" in s]
    assert len(asked) == 5 and "waiting" not in asked[-1].split("FROM")[0], asked
