"""The repository on both stores, where SQLite and PostgreSQL differ: row counts of a batched
``ON CONFLICT DO NOTHING``, 64-bit steps, JSON extraction in the scheduling pass, compare-and-set
under concurrency, the pause's and the preemption's statements, and ``seq`` order as concurrent
readers see it."""

import math
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from service.store import records as recordstore
from service.store import repository as repo
from service.store.db import make_engine, make_session_factory, upgrade
from service.store.tables import Job, MetricRecord
from tests.conftest import both_stores
from torchyard_contract.spec import JobSpec
from torchyard_contract.state import JobState

pytestmark = both_stores


def stored_records(session: Session, job_id: int) -> int:
    """How many records the database holds for ``job_id``."""
    return session.scalar(select(func.count()).select_from(MetricRecord)
                          .where(MetricRecord.job_id == job_id)) or 0



@pytest.fixture
def factories(
    tmp_path: Path, database_url: str | None
) -> Iterator[tuple[sessionmaker[Session], sessionmaker[Session]]]:
    """(writer, reader) session factories on a freshly migrated database."""
    url = database_url or f"sqlite:///{tmp_path / 'store.db'}"
    upgrade(url)
    writer, reader = make_engine(url), make_engine(url, readonly=True)
    yield make_session_factory(writer), make_session_factory(reader)
    writer.dispose()
    reader.dispose()


def _job(factory: sessionmaker[Session], **spec: object) -> int:
    with factory() as session:
        job = repo.create_job(session, JobSpec.model_validate({"dataset": "synthetic", **spec}))
        session.commit()
        return job.id


def _record(epoch: int, rank: int = 0, step: int | None = None, value: float = 1.0) -> recordstore.RecordIn:
    return recordstore.RecordIn(1, rank, epoch, step, "loss", value, 1.0 + epoch)


def test_batched_insert_counts_only_new_rows(factories) -> None:  # type: ignore[no-untyped-def]
    writer, _ = factories
    job_id = _job(writer)
    first = [_record(e) for e in range(5)]
    with writer() as s:
        assert recordstore.insert_records(s, job_id, first) == 5
        s.commit()
    # Half replayed, half new, and one new key twice within the batch.
    mixed = first[3:] + [_record(e) for e in range(5, 8)] + [_record(9), _record(9)]
    with writer() as s:
        assert recordstore.insert_records(s, job_id, mixed) == 4
        s.commit()
    with writer() as s:
        assert stored_records(s, job_id) == 9


def test_large_steps_and_nonfinite_values_round_trip(factories) -> None:  # type: ignore[no-untyped-def]
    writer, reader = factories
    job_id = _job(writer)
    batch = [_record(1, step=2**62, value=math.nan), _record(1, step=2**62 - 1, value=-math.inf)]
    with writer() as s:
        assert recordstore.insert_records(s, job_id, batch) == 2
        s.commit()
    with reader() as s:
        rows = recordstore.read_records(s, job_id, after=0, limit=10)
    assert [(r.step, r.value, r.nonfinite) for r in rows] == [
        (2**62, None, "NaN"), (2**62 - 1, None, "-Infinity")
    ]


def test_scheduling_pass_reads_spec_fields_from_the_database(factories) -> None:  # type: ignore[no-untyped-def]
    writer, reader = factories
    a = _job(writer, device="cpu", nproc_per_node=3, max_runtime_s=12.5, priority=4)
    b = _job(writer)
    with reader() as s:
        queue = sorted(repo.queued_for_scheduling(s))
    assert queue == [(a, 4, "cpu", 3, 12.5, None, False), (b, 0, "auto", 1, None, None, False)]


def _race(writer: sessionmaker[Session], job_id: int, targets: list[JobState]) -> list[JobState]:
    """Every target attempted at once from its own thread; the ones that won."""
    wins: list[JobState] = []
    barrier = threading.Barrier(len(targets))

    def move(to: JobState) -> None:
        with writer() as s:
            barrier.wait()
            if repo.transition(s, job_id, to):
                wins.append(to)
            s.commit()

    threads = [threading.Thread(target=move, args=(t,)) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return wins


def test_concurrent_transitions_have_exactly_one_winner(factories) -> None:  # type: ignore[no-untyped-def]
    writer, _ = factories
    targets = [JobState.starting, JobState.cancelled, JobState.failed, JobState.cancelled]
    for _ in range(5):
        job_id = _job(writer)
        wins = _race(writer, job_id, targets)
        # starting may come before cancelled/failed (both allowed from starting); two terminal
        # winners never.
        assert len([w for w in wins if w is not JobState.starting]) == 1, wins
        with writer() as s:
            assert repo.get_job(s, job_id).state in {"cancelled", "failed"}  # type: ignore[union-attr]


def test_the_pause_and_preemption_statements(factories) -> None:  # type: ignore[no-untyped-def]
    """What ``service.domain.loop.pauses`` runs, as each store runs it: counters added in SQL, a
    second preemption of a pausing job losing its compare-and-set, the preempted-and-paused list
    that a user's pause leaves. The live paths (SQLite) are tests/scheduling/test_preemption.py
    and tests/lifecycle/test_pause.py."""
    writer, _ = factories
    low, other, urgent = _job(writer), _job(writer), _job(writer)
    preempt = {"reason": f"preempted by job {urgent}", "preempted_by": urgent,
               "preemptions": Job.preemptions + 1}
    with writer() as s:
        for job_id in (low, other):
            assert repo.transition(s, job_id, JobState.starting)
            assert repo.transition(s, job_id, JobState.running)
            assert repo.transition(s, job_id, JobState.pausing, **preempt)
        assert not repo.transition(s, low, JobState.pausing, **preempt)  # already pausing
        assert repo.transition(s, urgent, JobState.paused, reason="a user's", preempted_by=None,
                               pauses=Job.pauses + 1, only_from=JobState.queued)
        for job_id in (low, other):
            assert repo.transition(s, job_id, JobState.paused, only_from=JobState.pausing)
        s.commit()
    with writer() as s:
        assert repo.preempted_and_paused(s) == [low, other]
        repo.keep_paused(s, other, "paused by a user")  # now the user's: not resumed on its own
        s.commit()
    with writer() as s:
        assert repo.preempted_and_paused(s) == [low]
        assert repo.count_preemptions(s) == 2
        assert repo.transition(s, low, JobState.queued, executor_ref=None,
                               only_from=JobState.paused)
        assert not repo.transition(s, low, JobState.queued, only_from=JobState.paused)
        s.commit()
        jobs = {job_id: repo.get_job(s, job_id) for job_id in (low, other, urgent)}
    assert (jobs[low].state, jobs[low].preempted_by, jobs[low].preemptions) == (  # type: ignore[union-attr]
        "queued", urgent, 1)
    assert (jobs[other].state, jobs[other].preempted_by, jobs[other].reason) == (  # type: ignore[union-attr]
        "paused", None, "paused by a user")
    assert (jobs[urgent].state, jobs[urgent].pauses) == ("paused", 1)  # type: ignore[union-attr]


def test_a_cursor_reader_never_skips_a_record_of_concurrent_writers(factories) -> None:  # type: ignore[no-untyped-def]
    """Batches of one job from several writers: a reader following ``seq`` sees every record
    exactly once (on PostgreSQL a later ``seq`` must never commit before an earlier one)."""
    writer, reader = factories
    job_id = _job(writer)
    writers, batches, size = 4, 25, 20
    done = threading.Event()

    def write(rank: int) -> None:
        for b in range(batches):
            with writer() as s:
                recordstore.insert_records(s, job_id, [
                    recordstore.RecordIn(1, rank, b, i, "loss", 0.5, 1.0) for i in range(size)
                ])
                s.commit()

    seen: list[int] = []

    def follow() -> None:
        after = 0
        while True:
            finished = done.is_set()
            with reader() as s:
                rows = recordstore.read_records(s, job_id, after=after, limit=1000)
            seen.extend(r.seq for r in rows)
            after = rows[-1].seq if rows else after
            if finished and not rows:
                return

    follower = threading.Thread(target=follow)
    follower.start()
    threads = [threading.Thread(target=write, args=(rank,)) for rank in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done.set()
    follower.join()
    assert len(seen) == len(set(seen)) == writers * batches * size


def test_the_reader_refuses_writes_and_reads_the_last_commit(factories) -> None:  # type: ignore[no-untyped-def]
    # GET routes read through the read-only engine: a write there must fail loudly, on either
    # store (SQLite: PRAGMA query_only; PostgreSQL: default_transaction_read_only per connection).
    writer, reader = factories
    job_id = _job(writer)
    with reader() as s:
        assert repo.job_state(s, job_id) == "queued"
        # (PostgreSQL's reader runs in autocommit: the COPY's savepoint fails before the write
        # would, outside a transaction block; a plain write fails as read-only.)
        with pytest.raises(Exception, match="(?i)read.?only|transaction block"):
            recordstore.insert_records(s, job_id, [_record(1)])
    with reader() as s, pytest.raises(Exception, match="(?i)read.?only"):
        repo.request_stop(s, job_id, "a write on the reader")
    with writer() as s:
        assert recordstore.read_records(s, job_id, after=0, limit=10) == []
    with reader.kw["bind"].connect() as conn:  # a plain connection, as the metrics route uses
        assert repo.job_state(conn, job_id) == "queued"
        assert recordstore.read_records(conn, job_id, after=0, limit=10) == []
