"""Queue policy on a simulated GPU list: priority, FIFO, gang allocation, backfill, reasons."""

import math

from service.domain.queue.scheduler import CPU, GPU, QueuedJob, RunningJob, plan

NOW = 1_000_000.0


def gpus(*indices: int) -> dict[str, list[str]]:
    return {GPU: [f"gpu:{i}" for i in indices], CPU: []}


def job(id: int, count: int = 1, priority: int = 0, runtime: float | None = None,
        kind: str = GPU) -> QueuedJob:
    return QueuedJob(id=id, priority=priority, kind=kind, count=count, max_runtime_s=runtime)


def launched(p) -> dict[int, list[str]]:  # type: ignore[no-untyped-def]
    return {launch.job_id: launch.resources for launch in p.launches}


def test_higher_priority_first_then_fifo() -> None:
    queue = [job(1), job(2, priority=5), job(3), job(4, priority=5)]
    p = plan(queue, gpus(0, 1), [], NOW)
    assert launched(p) == {2: ["gpu:0"], 4: ["gpu:1"]}
    assert p.waiting[1].position == 1 and p.waiting[3].position == 2
    assert p.waiting[1].reason == "needs 1 GPU; 0 free"


def test_gang_allocation_gives_distinct_gpus_or_nothing() -> None:
    p = plan([job(1, count=2), job(2, count=2)], gpus(0, 1, 2), [], NOW)
    assert launched(p) == {1: ["gpu:0", "gpu:1"]}
    assert p.waiting[2].reason == "needs 2 GPUs; 1 free"
    taken = [r for rs in launched(p).values() for r in rs]
    assert len(taken) == len(set(taken))


def test_large_head_job_is_not_starved_by_a_stream_of_small_ones() -> None:
    # 4 GPUs; a job holding 2 runs with no deadline; the head asks for all 4.
    running = [RunningJob(id=9, kind=GPU, count=2, ends_by=math.inf)]
    small = [job(i) for i in range(2, 12)]
    p = plan([job(1, count=4), *small], gpus(2, 3), running, NOW)
    assert launched(p) == {}, "small jobs without a deadline would delay the head forever"
    assert p.waiting[1].reason == "needs 4 GPUs; 2 free"
    assert p.waiting[2].reason.endswith("behind job 1") or "held for job 1" in p.waiting[2].reason


def test_backfill_a_job_that_ends_before_the_reserved_start() -> None:
    # The running job must end within 100 s; the head (4 GPUs) starts then at the latest.
    running = [RunningJob(id=9, kind=GPU, count=2, ends_by=NOW + 100)]
    queue = [job(1, count=4), job(2, runtime=50), job(3, runtime=500), job(4)]
    p = plan(queue, gpus(2, 3), running, NOW)
    assert launched(p) == {2: ["gpu:2"]}, "only the job guaranteed to end by then overtakes"
    assert "held for job 1" in p.waiting[3].reason


def test_backfill_on_resources_the_reserved_job_does_not_need() -> None:
    # 4 GPUs, 3 busy until NOW+100; head needs 2: at NOW+100, 4 free, 2 spare.
    running = [RunningJob(id=9, kind=GPU, count=3, ends_by=NOW + 100)]
    queue = [job(1, count=2), job(2)]
    p = plan(queue, gpus(3), running, NOW)
    assert launched(p) == {2: ["gpu:3"]}


def test_other_kind_is_not_blocked() -> None:
    free = {GPU: [], CPU: ["cpu:0", "cpu:1"]}
    p = plan([job(1, count=2), job(2, kind=CPU)], free, [], NOW)
    assert launched(p) == {2: ["cpu:0"]}
    assert p.waiting[1].reason == "needs 2 GPUs; 0 free"


def test_no_job_fits_more_than_the_free_list() -> None:
    p = plan([job(i, count=1 + i % 3) for i in range(1, 40)], gpus(*range(8)), [], NOW)
    taken = [r for rs in launched(p).values() for r in rs]
    assert len(taken) == len(set(taken)) <= 8
