"""Fair shares at scale (issue 47): a scheduling pass over 10,000 queued jobs across 20 teams,
against the same queue without teams, measured side by side in one run.

Two SQLite databases migrated by Alembic hold the same 10,000 queued jobs (same priorities,
sizes, a third preemptible) and two blockers holding every CPU slot, so no pass launches
anything and every pass does the whole work. In one, the jobs belong to 20 teams: 10 with
``max_slots`` 2 (two of them at it: the blockers are theirs), 5 with a slot-hour budget (2 of
them spent), shares 1–4, and 20,000 closed runs of the last 30 days in the usage account; in
the other no team exists (the queue is priority, then FIFO, as before teams).
Passes alternate between them (A, B, A, B, …), so load hits both alike. Measured per pass:

* the supervisor's whole pass (``Supervisor._schedule``: read the queue, the teams' standing,
  plan, waiting reasons, the reclaim and preemption choice) — the first pass of a term, which
  reads the usage history into the ledger, is reported on its own;
* the policy alone: the teams' standing (``Standings.book``: the teams and the runs that
  changed) plus ``scheduler.plan`` with it, against ``scheduler.plan`` without teams.
"""

import random
import statistics
import tempfile
import time
from pathlib import Path

from bench.common import Row, percentile
from bench.server import db_path, migrate

CPU_SLOTS = 4
TEAMS = 20
HISTORY_RUNS = 20_000
DAY_S = 86_400.0


def _load(home: Path, jobs: int, with_teams: bool, seed: int = 0) -> None:
    """The queue (and with teams: the teams and the usage history) into ``home``'s database."""
    from service.domain.queue.inventory import make_inventory
    from service.store import identity as identitystore
    from service.store import repository as repo
    from service.store.db import make_engine, make_session_factory
    from service.store.tables import SlotUsage
    from torchyard_contract.spec import JobSpec
    from torchyard_contract.state import JobState

    rng = random.Random(seed)
    engine = make_engine(f"sqlite:///{db_path(home)}")
    names = [f"team{i:02d}" for i in range(TEAMS)]
    now = time.time()
    with make_session_factory(engine)() as session:
        if with_teams:
            for i, name in enumerate(names):
                quota = {"max_slots": 2} if i % 2 == 0 else {}
                if i % 4 == 1:
                    quota["slot_hours"] = 5.0 if i % 8 == 1 else 1e6  # some spent, some not
                identitystore.create_team(session, name, quota=quota or None, share=1 + i % 4)
            session.add_all(SlotUsage(
                job_id=0, team=rng.choice(names), owner="bench", slots=rng.randint(1, 4),
                started_at=(start := now - rng.uniform(0, 30 * DAY_S)),
                ended_at=start + rng.uniform(60, 4 * 3600)) for _ in range(HISTORY_RUNS))
        # Two blockers of 2 slots hold the box; with teams, two capped teams' (at their quota).
        slots = make_inventory("none", CPU_SLOTS).resource_names("cpu")
        for k in range(2):
            blocker = repo.create_job(session, JobSpec(name="blocker", nproc_per_node=2),
                                      team=names[2 * k] if with_teams else None)
            repo.transition(session, blocker.id, JobState.starting, started_at=repo.utcnow())
            repo.allocate(session, blocker.id, slots[2 * k:2 * k + 2])
        for i in range(jobs):
            spec = JobSpec(name="queued", priority=rng.randint(0, 50),
                           nproc_per_node=rng.choice((1, 1, 2)), preemptible=i % 3 == 0)
            repo.create_job(session, spec, team=names[i % TEAMS] if with_teams else None,
                            owner="bench")
        session.commit()
    engine.dispose()


def _supervisor(home: Path):  # type: ignore[no-untyped-def]
    from service.domain.loop.supervisor import Supervisor
    from service.domain.queue.inventory import make_inventory
    from service.executor.local import LocalExecutor
    from service.settings import Settings
    from service.store.db import make_engine, make_session_factory

    url = f"sqlite:///{db_path(home)}"
    engines = (make_engine(url), make_engine(url, readonly=True))
    supervisor = Supervisor(
        settings=Settings(home=home, gpus="none", cpu_slots=CPU_SLOTS),
        session_factory=make_session_factory(engines[0]),
        read_session_factory=make_session_factory(engines[1]),
        inventory=make_inventory("none", CPU_SLOTS), executor=LocalExecutor(),
    )
    return supervisor, engines


def _pass(supervisor) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """(wall s, CPU s of this thread) of one pass."""
    supervisor._queue_dirty = True
    t0, c0 = time.perf_counter(), time.thread_time()
    supervisor._schedule()
    return time.perf_counter() - t0, time.thread_time() - c0


def _policy(supervisor, queue, active, running, with_teams: bool) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    from service.domain.loop.scheduling import held_by_team
    from service.domain.queue import scheduler

    standings = supervisor.scheduling.standings
    t0, c0 = time.perf_counter(), time.thread_time()
    book = None
    if with_teams:
        with supervisor.ctx.read_sessions() as session:
            book = standings.book(session, time.time(), held_by_team(active))
    scheduler.plan(queue, {scheduler.CPU: []}, running, time.time(), book)
    return time.perf_counter() - t0, time.thread_time() - c0


def _queue(supervisor):  # type: ignore[no-untyped-def]
    from service.domain.queue import scheduler
    from service.store import repository as repo

    with supervisor.ctx.read_sessions() as session:
        queue = [scheduler.QueuedJob(i, p, scheduler.CPU, n, r, t, bool(pre))
                 for i, p, _d, n, r, t, pre in repo.queued_for_scheduling(session)]
        held = repo.allocated_resources(session)
        running, active = supervisor.scheduling._running_jobs(session, held)
    return queue, active, running


def _rule(reason: str) -> str:
    """Which rule a waiting reason names (docs/scheduling.md, "Waiting reasons")."""
    for words, rule in (("slot-hours", "budget"), ("holds", "quota"), ("borrow", "borrowing"),
                        ("by fair share", "fair share"), ("held for", "reservation"),
                        ("behind job", "priority")):
        if words in reason:
            return rule
    return "capacity"


def run(smoke: bool) -> list[Row]:
    jobs = 200 if smoke else 10_000
    passes = 5 if smoke else 60
    with tempfile.TemporaryDirectory(prefix="bench-fairshare-") as tmp:
        homes = {True: Path(tmp) / "teams", False: Path(tmp) / "plain"}
        for with_teams, home in homes.items():
            migrate(home)
            _load(home, jobs, with_teams)
        sups = {k: _supervisor(h) for k, h in homes.items()}
        try:
            first, _ = _pass(sups[True][0])  # the term's first pass: the ledger reads the history
            _pass(sups[False][0])
            full: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
            policy: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
            reads: list[float] = []
            inputs = {k: _queue(s) for k, (s, _) in sups.items()}
            for _ in range(passes):
                for with_teams in (True, False):
                    supervisor = sups[with_teams][0]
                    full[with_teams].append(_pass(supervisor))
                    policy[with_teams].append(_policy(supervisor, *inputs[with_teams], with_teams))
                t0 = time.perf_counter()
                _queue(sups[True][0])
                reads.append(time.perf_counter() - t0)
            waiting = {k: len(s._waiting or {}) for k, (s, _) in sups.items()}
            reasons = {_rule(w.reason) for w in (sups[True][0]._waiting or {}).values()}
        finally:
            for _, engines in sups.values():
                for engine in engines:
                    engine.dispose()
    assert waiting == {True: jobs, False: jobs}, waiting
    label = f"{jobs:,} queued jobs, {TEAMS} teams vs none; {passes} passes each, alternating"

    def rows(name: str, values: dict[bool, list[tuple[float, float]]], goal: str) -> list[Row]:
        wall = {k: [w for w, _ in v] for k, v in values.items()}
        cpu = {k: [c for _, c in v] for k, v in values.items()}
        # Each pass with teams is paired with the pass without that ran next to it: the median
        # of the pairs' ratios, so a burst of load on this shared machine hits both of a pair.
        ratio = statistics.median(a / b for a, b in zip(cpu[True], cpu[False], strict=True))
        return [
            Row("fairshare", f"{name}, teams: p50", percentile(wall[True], 50) * 1000, "ms", "",
                label),
            Row("fairshare", f"{name}, teams: p99", percentile(wall[True], 99) * 1000, "ms",
                "< 50 ms" if goal else ""),
            Row("fairshare", f"{name}, no teams: p50", percentile(wall[False], 50) * 1000, "ms"),
            Row("fairshare", f"{name}, no teams: p99", percentile(wall[False], 99) * 1000, "ms"),
            Row("fairshare", f"{name}, CPU: teams / no teams (median of pairs)", ratio, "×", goal,
                f"{statistics.median(cpu[True]) * 1000:.1f} / "
                f"{statistics.median(cpu[False]) * 1000:.1f} ms of this thread's CPU (p50)"),
        ]

    return [
        *rows("policy (standing + plan)", policy, "≤ 1.5"),
        *rows("whole supervisor pass", full, ""),
        Row("fairshare", "of a pass: reading the queue (p50)", percentile(reads, 50) * 1000, "ms",
            "", "the same with or without teams: SQLite extracts 3 spec fields per row"),
        Row("fairshare", "first pass of a term (ledger reads the history)", first * 1000, "ms",
            "", f"{HISTORY_RUNS:,} runs of the last 30 days"),
        Row("fairshare", "waiting rules named", float(len(reasons)), "", "",
            ", ".join(sorted(reasons))),
    ]


if __name__ == "__main__":
    import sys

    for row in run("--smoke" in sys.argv):
        print(row)
