"""Teams in the queue policy, pure (docs/scheduling.md, "Teams"): fair share before priority,
the quota and budget holds and their reasons, borrowing past a quota, the reservation for the
head of the fair-share order, and which borrowed jobs a reclaim pauses."""

from service.domain.queue import reclaim
from service.domain.queue.preemption import ActiveJob, Preemption
from service.domain.queue.quota import TeamBook, TeamRules
from service.domain.queue.scheduler import CPU, QueuedJob, RunningJob, plan

NOW = 1_000_000.0


def cpus(n: int) -> dict[str, list[str]]:
    return {CPU: [f"cpu:{i}" for i in range(n)]}


def job(id_: int, team: str | None, priority: int = 0, count: int = 1,
        preemptible: bool = False, runtime: float | None = None) -> QueuedJob:
    return QueuedJob(id_, priority, CPU, count, runtime, team, preemptible)


def launched(p) -> list[int]:  # type: ignore[no-untyped-def]
    return [launch.job_id for launch in p.launches]


def test_the_team_with_less_recent_usage_starts_first_whatever_the_priority() -> None:
    book = TeamBook(factor={"vision": 12.0, "nlp": 3.0})
    queue = [job(1, "vision", priority=90), job(2, "nlp", priority=0), job(3, "nlp", 5)]
    p = plan(queue, cpus(1), [], NOW, book)
    assert launched(p) == [3], "nlp first (lower factor), its own jobs by priority"
    assert p.waiting[2].reason == "needs 1 CPU slot; 0 free"  # behind its own team's job
    assert p.waiting[1].reason == "needs 1 CPU slot; 0 free, behind team nlp's job 2 by fair share"
    assert [p.waiting[2].position, p.waiting[1].position] == [1, 2]
    # Without teams the same queue is priority first, as before.
    assert launched(plan(queue, cpus(1), [], NOW)) == [1]


def test_a_team_at_its_quota_waits_saying_so_and_a_preemptible_job_borrows() -> None:
    book = TeamBook(max_slots={"vision": 1}, held={"vision": 1})
    queue = [job(1, "vision"), job(2, "vision", preemptible=True), job(3, "vision", count=2)]
    p = plan(queue, cpus(2), [], NOW, book)
    assert launched(p) == [2], "the preemptible one borrows the idle slot"
    assert p.waiting[1].reason == "team vision holds 1 of its 1 slot"
    assert p.waiting[3].reason == "team vision holds 1 of its 1 slot"  # (the borrower comes last)
    half = TeamBook(max_slots={"vision": 4}, held={"vision": 3})
    assert plan([job(4, "vision", count=2)], cpus(4), [], NOW, half).waiting[4].reason == \
        "team vision holds 3 of its 4 slots; this job needs 2"


def test_a_borrower_takes_idle_slots_only_and_reserves_none() -> None:
    book = TeamBook(max_slots={"vision": 1}, held={"vision": 1}, factor={"nlp": 1.0})
    running = [RunningJob(9, CPU, 1, NOW + 10)]
    queue = [job(1, "vision", preemptible=True, count=2), job(2, "nlp")]
    p = plan(queue, cpus(1), running, NOW, book)
    assert launched(p) == [2], "the borrower blocks nothing behind it"
    assert p.waiting[1].reason == ("needs 2 CPU slots; 0 free; past team vision's 1 slots it "
                                   "may only borrow idle ones")
    assert 1 not in [h.id for h in p.heads.values()]


def test_a_borrower_never_takes_a_slot_a_job_within_its_quota_waits_for() -> None:
    # vision has used less (it would come first) but is at its quota: its preemptible job only
    # borrows, after nlp's job within its quota took the one free slot.
    book = TeamBook(factor={"vision": 0.0, "nlp": 9.0}, max_slots={"vision": 1},
                    held={"vision": 1})
    queue = [job(1, "vision", preemptible=True), job(2, "nlp")]
    p = plan(queue, cpus(1), [], NOW, book)
    assert launched(p) == [2]
    assert p.waiting[1] == (1, "needs 1 CPU slot; 0 free; past team vision's 1 slots it may "
                               "only borrow idle ones")
    assert launched(plan(queue, cpus(2), [], NOW, TeamBook(
        factor={"vision": 0.0, "nlp": 9.0}, max_slots={"vision": 1}, held={"vision": 1}))) == [2, 1]


def test_a_spent_budget_holds_every_job_of_the_team_and_nothing_else() -> None:
    why = "team vision used 500.2 of 500 slot-hours this month; resets 2027-01-01T00:00Z"
    book = TeamBook(spent={"vision": why})
    queue = [job(1, "vision", priority=5, preemptible=True), job(2, "nlp", count=4)]
    p = plan(queue, cpus(2), [], NOW, book)
    assert p.waiting[1].reason == why and launched(p) == []
    assert p.heads[CPU].id == 2, "the reservation goes to the first job that waits for capacity"


def test_the_head_of_the_fair_share_order_holds_the_reservation() -> None:
    book = TeamBook(factor={"big": 0.0, "small": 5.0})
    running = [RunningJob(9, CPU, 2, NOW + 100)]
    queue = [job(1, "small", priority=50), job(2, "big", count=4), job(3, "small", runtime=500)]
    p = plan(queue, cpus(2), running, NOW, book)
    assert launched(p) == []
    assert p.waiting[2].reason == "needs 4 CPU slots; 2 free"
    assert p.waiting[1].reason == ("needs 1 CPU slot; 2 free, held for team big's job 2 "
                                   "(ahead by fair share)")
    p = plan([*queue, job(4, "small", runtime=50)], cpus(2), running, NOW, book)
    assert launched(p) == [4], "a job that ends before the reserved start still backfills"


def test_team_rules_read_leniently_from_the_stored_quota() -> None:
    rules = TeamRules.of("a", {"max_slots": 4, "slot_hours": 500, "period": "rolling_30d"}, 2)
    assert (rules.max_slots, rules.slot_hours, rules.period.value, rules.share) == (
        4, 500.0, "rolling_30d", 2.0)
    odd = TeamRules.of("a", {"max_slots": "4", "period": "weekly"}, 0)
    assert (odd.max_slots, odd.period.value, odd.share) == (None, "month", 1.0)
    assert TeamRules.of("a", None, None).max_slots is None


def _active(id_: int, team: str, count: int = 1, age_s: float = 100, preemptible: bool = True,
            pausing: bool = False, before: bool = False) -> ActiveJob:
    return ActiveJob(id_, 0, CPU, count, NOW - age_s, preemptible, pausing, before, team)


def test_borrowed_jobs_are_the_newest_preemptible_ones_past_the_quota() -> None:
    active = [_active(1, "a", age_s=300, preemptible=False), _active(2, "a", age_s=200),
              _active(3, "a", age_s=100), _active(4, "b")]
    assert [j.id for j in reclaim.borrowed(active, {"a": 1})] == [3, 2]
    assert [j.id for j in reclaim.borrowed(active, {"a": 2})] == [3]
    assert reclaim.borrowed(active, {"a": 3}) == [], "within its quota"
    pausing = [*active[:2], _active(3, "a", pausing=True)]
    assert [j.id for j in reclaim.borrowed(pausing, {"a": 1})] == [2]


def test_a_reclaim_pauses_the_fewest_borrowed_jobs_newest_first() -> None:
    active = [_active(1, "a", age_s=500, preemptible=False), _active(2, "a", count=2, age_s=400),
              _active(3, "a", age_s=300), _active(4, "a", age_s=200)]
    # b needs 2: one job of 2 slots is fewer than the two newest of 1.
    assert reclaim.choose(job(9, "b", count=2), 0, active, {"a": 1}, 60, NOW) == \
        Preemption(9, (2,))
    # needs 1: the newest borrowed job.
    assert reclaim.choose(job(9, "b"), 0, active, {"a": 1}, 60, NOW) == Preemption(9, (4,))
    # a free slot and a pause under way make room: nothing more is paused.
    assert reclaim.choose(job(9, "b"), 1, active, {"a": 1}, 60, NOW) is None
    coming = [*active[:3], _active(4, "a", pausing=True)]
    assert reclaim.choose(job(9, "b"), 0, coming, {"a": 1}, 60, NOW) is None


def test_a_reclaim_never_helps_a_team_past_its_quota_or_itself_or_too_early() -> None:
    active = [_active(1, "a", preemptible=False), _active(2, "a"), _active(3, "b")]
    assert reclaim.choose(job(9, "b"), 0, active, {"a": 1, "b": 1}, 60, NOW) is None, \
        "b holds its one slot already: it may only borrow"
    assert reclaim.choose(job(9, "a"), 0, active, {"a": 1}, 60, NOW) is None, "its own"
    again = [_active(1, "a", preemptible=False), _active(2, "a", age_s=30, before=True)]
    assert reclaim.choose(job(9, "c"), 0, again, {"a": 1}, 60, NOW) is None, "min run time"
    later = [_active(1, "a", preemptible=False), _active(2, "a", age_s=90, before=True)]
    assert reclaim.choose(job(9, "c"), 0, later, {"a": 1}, 60, NOW) == Preemption(9, (2,))
    assert reclaim.choose(job(9, None, count=3), 0, active, {"a": 1}, 60, NOW) is None, \
        "not enough borrowed slots: none is paused for nothing"
