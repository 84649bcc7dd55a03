"""Preemption by priority (issue 25, item 2): the pure choice
(``service.domain.queue.preemption``), then real jobs: a preemptible low-priority job on every
slot is paused for an urgent one, resumes by itself and ends with every epoch once, and a second
urgent job inside the minimum run time does not preempt it (docs/lifecycle.md); the live test
on both stores."""

import time
from collections import Counter
from collections.abc import Callable
from datetime import datetime

from service.domain.queue.preemption import ActiveJob, Preemption, choose
from service.domain.queue.scheduler import CPU, GPU, QueuedJob
from tests.conftest import LiveServer, every_record

NOW = 1_000_000.0


def _active(id_: int, priority: int, count: int, age_s: float, preemptible: bool = True,
            pausing: bool = False, kind: str = CPU) -> ActiveJob:
    return ActiveJob(id_, priority, kind, count, NOW - age_s, preemptible, pausing)


def _queued(id_: int, priority: int, count: int, kind: str = CPU) -> QueuedJob:
    return QueuedJob(id_, priority, kind, count, None)


def test_takes_the_lowest_priority_then_the_most_recently_started() -> None:
    active = [_active(1, 0, 2, 500), _active(2, -5, 2, 400), _active(3, 0, 2, 200)]
    # Needs 4 of 0 free: job 2 (lowest priority) first, then job 3 (started after job 1).
    assert choose([_queued(9, 10, 4)], {CPU: 0}, active, 60, NOW) == [Preemption(9, (2, 3))]


def test_never_preempts_when_it_cannot_make_room_or_may_not() -> None:
    not_enough = [_active(1, 0, 2, 500), _active(2, 0, 2, 500, preemptible=False)]
    assert choose([_queued(9, 10, 4)], {CPU: 0}, not_enough, 60, NOW) == []
    same_priority = [_active(1, 10, 4, 500)]
    assert choose([_queued(9, 10, 4)], {CPU: 0}, same_priority, 60, NOW) == []
    again_too_soon = [ActiveJob(1, 0, CPU, 4, NOW - 30, True, False, preempted_before=True)]
    assert choose([_queued(9, 10, 4)], {CPU: 0}, again_too_soon, 60, NOW) == []
    again_later = [ActiveJob(1, 0, CPU, 4, NOW - 90, True, False, preempted_before=True)]
    assert choose([_queued(9, 10, 4)], {CPU: 0}, again_later, 60, NOW) == [Preemption(9, (1,))]
    other_kind = [_active(1, 0, 4, 500, kind=GPU)]
    assert choose([_queued(9, 10, 4)], {CPU: 0}, other_kind, 60, NOW) == []


def test_waits_for_a_pause_under_way_and_counts_free_slots() -> None:
    pausing = [_active(1, 0, 2, 500, pausing=True), _active(2, 0, 2, 500)]
    assert choose([_queued(9, 10, 2)], {CPU: 0}, pausing, 60, NOW) == []
    # One free slot and one to take: a single victim is enough.
    assert choose([_queued(9, 10, 3)], {CPU: 1}, [_active(1, 0, 2, 500), _active(2, 0, 2, 90)],
                  60, NOW) == [Preemption(9, (2,))]


def test_only_the_first_waiting_job_of_a_kind_preempts() -> None:
    active = [_active(1, 0, 4, 500)]
    queue = [_queued(8, 1, 4), _queued(9, 10, 4)]
    assert choose(queue, {CPU: 0}, active, 60, NOW) == [Preemption(9, (1,))]


def _utc(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


# SQLite: the compare-and-sets it makes (pausing the victim, queueing it again) are run on both
# stores by tests/store/test_store.py::test_the_pause_and_preemption_statements.
def test_an_urgent_job_preempts_a_preemptible_one_which_resumes(
    live_server_factory: Callable[..., LiveServer],
) -> None:
    """A server of its own: the low-priority job takes every slot."""
    server = live_server_factory(
        TORCHYARD_PREEMPT_MIN_RUN_S="300",  # longer than the preempted job's whole run
        TORCHYARD_TEST_EPOCH_SLEEP_S="0.5",
    )
    low_spec = {"dataset": "synthetic", "epochs": 12, "nproc_per_node": 4, "preemptible": True,
                "synthetic_samples": 256}
    urgent = {"dataset": "synthetic", "epochs": 2, "nproc_per_node": 2, "priority": 5}
    with server.client() as c:
        low = c.post("/jobs", json=low_spec).json()["id"]
        server.wait_for(low, {"running"})
        high = c.post("/jobs", json=urgent).json()["id"]
        server.wait_for(low, {"paused", "queued"}, timeout_s=60, allowed={"running", "pausing"})
        # Queued again on its own, saying why it waits, behind the urgent job.
        deadline = time.monotonic() + 60
        while (job := c.get(f"/jobs/{low}").json())["state"] != "queued":
            assert job["state"] in ("pausing", "paused"), job
            assert time.monotonic() < deadline, job
            time.sleep(0.1)
        assert job["reason"] == f"preempted by job {high}" and job["preempted_by"] == high
        high_job = server.wait_for(high, {"succeeded"})
        low_job = server.wait_for(low, {"starting", "running"}, allowed={"queued"})
        # Inside the minimum run time: a second urgent job waits for it to end.
        second = c.post("/jobs", json=urgent).json()["id"]
        assert low_job["preemptions"] == 1 and low_job["preempted_by"] is None
        low_job = server.wait_for(low, {"succeeded"}, timeout_s=120)
        second_job = server.wait_for(second, {"succeeded"})
        assert low_job["preemptions"] == 1 and low_job["pauses"] == 1
        assert _utc(second_job["started_at"]) >= _utc(low_job["ended_at"]) - 1
        assert _utc(high_job["started_at"]) < _utc(low_job["ended_at"])
        exposition = c.get("/metrics").text
    assert "torchyard_preemptions_total 1.0" in exposition
    seen = Counter((r["rank"], r["epoch"]) for r in every_record(server, low)
                   if r["name"] == "loss")
    assert set(seen) == {(r, e) for r in range(4) for e in range(1, 13)}
    assert max(seen.values()) == 1
