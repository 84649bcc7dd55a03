"""The slot usage account on both stores (``service.store.usage``): a run opens with the
allocation and closes once however many paths free the job (two at once, too); the report's
windows and groups; and the teams' standing read from the store with a clock the test moves
(the half-life decay, a budget spent), never a sleep."""

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from service.domain.queue.fairshare import HOUR_S
from service.domain.queue.standing import Standings
from service.store import identity as identitystore
from service.store import repository as repo
from service.store import usage
from service.store.db import make_engine, make_session_factory, upgrade
from tests.conftest import both_stores
from torchyard_contract.spec import JobSpec

pytestmark = both_stores
T0 = 1_795_000_000.0  # 2026-11-18, a fixed clock: nothing here reads the time
H = 168 * HOUR_S


@pytest.fixture
def writer(tmp_path: Path, database_url: str | None) -> Iterator[sessionmaker[Session]]:
    url = database_url or f"sqlite:///{tmp_path / 'store.db'}"
    upgrade(url)
    engine = make_engine(url)
    yield make_session_factory(engine)
    engine.dispose()


def _job(writer: sessionmaker[Session], team: str | None, owner: str = "alice") -> int:
    with writer() as session:
        if team is not None and identitystore.get_team(session, team) is None:
            identitystore.create_team(session, team)
        job = repo.create_job(session, JobSpec(dataset="synthetic"), owner=owner, team=team)
        session.commit()
        return job.id


def _run(writer: sessionmaker[Session], job_id: int, slots: int, start: float,
         end: float | None) -> None:
    with writer() as session:
        usage.open_run(session, job_id, slots, start)
        if end is not None:
            assert usage.close_runs(session, job_id, end) == 1
        session.commit()


def test_a_run_opens_with_its_slots_and_closes_once(writer: sessionmaker[Session]) -> None:
    job_id = _job(writer, "vision")
    with writer() as session:
        usage.open_run(session, job_id, 2, T0)
        repo.allocate(session, job_id, ["cpu:0", "cpu:1"])  # the same start again: no new run
        session.commit()
    done = []

    def release() -> None:
        with writer() as session:
            done.append(usage.close_runs(session, job_id, T0 + 60))
            session.commit()

    threads = [threading.Thread(target=release) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with writer() as session:
        repo.release(session, job_id)  # a third path frees it: nothing left to close
        session.commit()
        runs = usage.runs_of_job(session, job_id)
    assert sorted(done) == [0, 1], "two paths freeing the job at once close its run once"
    assert [(r.team, r.owner, r.slots, r.ended_at) for r in runs] == [
        ("vision", "alice", 2, T0 + 60)]


def test_the_report_clips_runs_to_the_window_and_groups_them(writer: sessionmaker[Session]) -> None:
    a1, a2, b1 = _job(writer, "a"), _job(writer, "a", owner="ann"), _job(writer, "b", owner="bo")
    _run(writer, a1, 2, T0, T0 + 100)
    _run(writer, a1, 2, T0 + 200, T0 + 300)  # resumed after a pause: a second run
    _run(writer, a2, 1, T0 + 50, None)  # still holding its slot
    _run(writer, b1, 4, T0 - 100, T0 + 10)
    with writer() as session:
        teams = usage.report(session, "team", T0, T0 + 1000)
        assert [(t.team, t.slot_seconds, t.jobs, t.attempts) for t in teams] == [
            ("a", 2 * 100 + 2 * 100 + 950, 2, 3), ("b", 40, 1, 1)]
        window = usage.report(session, "job", T0 + 50, T0 + 250, team="a", everyone=False)
        assert [(t.job_id, t.user, t.slot_seconds) for t in window] == [
            (a1, "alice", 2 * 50 + 2 * 50), (a2, "ann", 200)]
        assert usage.report(session, "user", T0, T0 + 1000, team=None, everyone=False) == []
        open_and_recent = usage.runs_for_ledger(session, closed_since=T0 + 150)
        assert sorted((r.slots, r.ended_at) for r in open_and_recent) == [(1, None), (2, T0 + 300)]


def test_standing_decays_by_half_per_half_life_and_a_budget_is_spent(
    writer: sessionmaker[Session],
) -> None:
    job_id = _job(writer, "vision")
    with writer() as session:
        identitystore.create_team(session, "nlp", share=2.0)
        identitystore.update_team(session, "vision", {
            "quota": {"max_slots": 4, "slot_hours": 1.5, "period": "month"}})
        session.commit()
    _run(writer, job_id, 2, T0, T0 + HOUR_S)  # 2 slot-hours
    _run(writer, _job(writer, "nlp"), 1, T0, T0 + HOUR_S)
    keeper = Standings(H)
    with writer() as session:
        now = keeper.read(session, T0 + HOUR_S)
        later = keeper.read(session, T0 + HOUR_S + H)  # the clock moved one half-life
        book = keeper.book(session, T0 + HOUR_S + H, {"vision": 0})
    vision, nlp = now["vision"], now["nlp"]
    assert vision.recent_slot_hours == pytest.approx(2, rel=3e-3)
    assert nlp.factor == pytest.approx(nlp.recent_slot_hours / 2) and (nlp.rank, vision.rank) == (1, 2)
    assert later["vision"].recent_slot_hours == pytest.approx(vision.recent_slot_hours / 2, rel=1e-9)
    assert vision.period_slot_hours == pytest.approx(2) and vision.spent is not None
    assert vision.spent.startswith("team vision used 2 of 1.5 slot-hours this month")
    assert book is not None and book.spent["vision"] == later["vision"].spent
    assert book.factor["vision"] == pytest.approx(later["vision"].factor)
