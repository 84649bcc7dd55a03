"""The dashboard's pages in Chromium (issue 49): how long a page takes to draw with a big history.

* **Baseline:** the job list with 100 jobs (its first page drawn), measured in the same run.
* The job list of a server with 10,000 jobs: its first page (100 rows) drawn, and the next page
  by cursor ("Older →").
* The page of a sweep of 200 trials (2 ranks, ``EPOCHS`` epochs each: 80,000 records): its
  trials table, the objective per epoch of every trial, the parallel coordinates and the scatter
  drawn. ``GET /sweeps/{id}/series`` alone is timed too.

Each figure is from a page load (the browser's cache warm, as for a tab a team keeps open) until
what the page shows is on screen (``performance.now()`` from the navigation's start), the median
of ``REPEATS`` loads, baseline and target alternating. Jobs and records are written straight into
the database before the server starts (set-up speed, not what is measured); the server runs
without its supervisor (``bench.server``) so nothing changes under the page.
Debian's Chromium (``/usr/bin/chromium``) through Playwright, as in tests/dashboard/.
"""

import json
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from bench.common import Row
from bench.server import Server, db_path, migrate

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update"]
PAGE_ROWS = 100  # the job list's page
EPOCHS = 200
RANKS = 2
REPEATS = 5
TIMEOUT_MS = 60_000


def fill(home: Path, jobs: int, trials: int, epochs: int) -> int:
    """``jobs`` finished jobs, ``trials`` of them a sweep's (its id returned), each trial with
    ``epochs`` per-epoch losses from each of ``RANKS`` ranks, one in four pruned halfway."""
    from service.domain.sweeps.spec import SweepSpec
    from service.store import repository as repo
    from service.store import sweeps as sweepstore
    from service.store.db import make_engine, make_session_factory
    from torchyard_contract.spec import JobSpec
    from torchyard_contract.state import JobState

    migrate(home)
    spec = SweepSpec.model_validate({
        "name": "bench", "spec": {"dataset": "synthetic", "nproc_per_node": RANKS},
        "space": {"lr": {"type": "log_uniform", "low": 1e-4, "high": 1.0},
                  "batch_size": {"type": "choice", "values": [32, 64, 128]}},
        "prune": {"type": "median"}, "max_trials": max(trials, 1),
    })
    engine = make_engine(f"sqlite:///{db_path(home)}")
    trial_ids: list[int] = []
    try:
        with make_session_factory(engine)() as session:
            sweep = sweepstore.create_sweep(session, "bench", 0, spec.model_dump(mode="json"))
            for i in range(jobs - trials):
                job = repo.create_job(session, JobSpec(name=f"job-{i}", dataset="synthetic",
                                                       labels={"team": f"t{i % 10}"}))
                job.state, job.ended_at = JobState.succeeded.value, repo.utcnow()
                if i % 1000 == 999:
                    session.commit()
            for n in range(1, trials + 1):
                params = {"lr": 10 ** (-4 + 4 * n / trials), "batch_size": [32, 64, 128][n % 3]}
                job = repo.create_job(session, spec.trial_spec(sweep.id, n, params))
                sweepstore.mark_trial(session, job.id, sweep.id, n, params)
                pruned = n % 4 == 0
                job.state = (JobState.cancelled if pruned else JobState.succeeded).value
                job.pruned_epoch = epochs // 2 if pruned else None
                job.ended_at = repo.utcnow()
                trial_ids.append(job.id)
            sweepstore.end_sweep(session, sweep.id, "succeeded", None)
            session.commit()
            sweep_id = sweep.id
    finally:
        engine.dispose()
    conn = sqlite3.connect(db_path(home))
    try:
        with conn:
            conn.executemany(
                "INSERT INTO metric_records "
                "(job_id, attempt, rank, epoch, step, name, value, nonfinite, time) "
                "VALUES (?, 1, ?, ?, -1, 'loss', ?, NULL, 0)",
                ((j, r, e, (1 + k % 7) / e + 0.01 * r) for k, j in enumerate(trial_ids)
                 for r in range(RANKS) for e in range(1, epochs + 1)))
    finally:
        conn.close()
    return sweep_id


def page_ms(pg, url: str, done_js: str) -> float:  # type: ignore[no-untyped-def]
    """ms from the navigation's start until ``done_js`` holds."""
    pg.goto("about:blank")
    pg.goto(url)
    pg.wait_for_function(done_js, polling="raf", timeout=TIMEOUT_MS)
    return float(pg.evaluate("() => performance.now()"))


def rows_drawn(n: int, tbody: str = "#job-rows") -> str:
    return f"() => document.querySelectorAll('{tbody} tr').length === {n}"


def sweep_drawn(trials: int) -> str:
    charts = ["sweep-chart", "sweep-parcoords", "sweep-scatter"]
    drawn = " && ".join(f"document.getElementById('{c}')?.dataset.updates" for c in charts)
    return f"() => {rows_drawn(trials, '#trials-table tbody')[6:]} && !!({drawn})"


def run(smoke: bool) -> list[Row]:
    from playwright.sync_api import sync_playwright

    if not CHROMIUM.exists():
        raise RuntimeError("bench.dashboard needs Debian's Chromium (apt-get install chromium)")
    # Smoke: more trials than the sweep page draws one line each for (it groups them).
    jobs, trials, epochs = (300, 25, 10) if smoke else (10_000, 200, EPOCHS)
    repeats = 1 if smoke else REPEATS
    with tempfile.TemporaryDirectory(prefix="bench-dash-") as tmp:
        big, small = Path(tmp) / "big", Path(tmp) / "small"
        t0 = time.perf_counter()
        sweep_id = fill(big, jobs, trials, epochs)
        fill(small, PAGE_ROWS, 0, 0)
        fill_s = time.perf_counter() - t0
        with (Server.start(big, supervisor=False) as server,
              Server.start(small, supervisor=False) as base, sync_playwright() as pw):
            calls = []
            for _ in range(repeats + 1):  # the first imports numpy and tsdownsample: not counted
                t0 = time.perf_counter()
                r = httpx.get(f"{server.url}/sweeps/{sweep_id}/series",
                              params={"max_points": max(16, 20_000 // trials)}, timeout=60)
                calls.append(time.perf_counter() - t0)
                r.raise_for_status()
            series_s = statistics.median(calls[1:])
            series_kb = len(r.content) / 1024
            assert len(r.json()["trials"]) == trials
            browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
            pg = browser.new_page(viewport={"width": 1280, "height": 800})
            errors: list[str] = []  # a page that errs draws nothing worth timing
            pg.on("pageerror", lambda exc: errors.append(str(exc)))
            pg.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page_ms(pg, f"{base.url}/#/", rows_drawn(PAGE_ROWS))  # the cache warm, plotly.js in it
            page_ms(pg, f"{server.url}/#/sweeps/{sweep_id}", sweep_drawn(trials))
            baseline, listed, older, sweep = [], [], [], []
            for _ in range(repeats):
                baseline.append(page_ms(pg, f"{base.url}/#/", rows_drawn(PAGE_ROWS)))
                listed.append(page_ms(pg, f"{server.url}/#/", rows_drawn(PAGE_ROWS)))
                first = pg.locator("#job-rows tr").first.get_attribute("data-job-id")
                t0 = time.perf_counter()
                pg.locator("#page-older").click()
                pg.wait_for_function(
                    f"() => document.querySelector('#job-rows tr')?.dataset.jobId === "
                    f"'{int(first or 0) - PAGE_ROWS}'", polling="raf", timeout=TIMEOUT_MS)
                older.append((time.perf_counter() - t0) * 1000)
                sweep.append(page_ms(pg, f"{server.url}/#/sweeps/{sweep_id}", sweep_drawn(trials)))
            browser.close()
            if errors:
                raise RuntimeError(f"the dashboard erred: {errors[:3]}")
    base_ms, list_ms, sweep_ms = (statistics.median(v) for v in (baseline, listed, sweep))
    records = trials * RANKS * epochs
    return [
        Row("dashboard", "baseline: job list of 100 jobs, first page drawn", base_ms, "ms", "",
            f"median of {repeats} loads, cache warm; set-up {fill_s:.0f} s"),
        Row("dashboard", "big job list: first page drawn", list_ms, "ms", "< 1000",
            f"{jobs:,} jobs, {PAGE_ROWS} rows"),
        Row("dashboard", "job list: ratio to baseline", list_ms / base_ms, "×", ""),
        Row("dashboard", "job list: next page by cursor drawn", statistics.median(older), "ms",
            "", "click on Older → until its first row is there"),
        Row("dashboard", "sweep page drawn", sweep_ms, "ms", "< 1000",
            f"{trials} trials, {records:,} records: table, objective per epoch, parallel "
            "coordinates, scatter"),
        Row("dashboard", "sweep page: ratio to baseline", sweep_ms / base_ms, "×", ""),
        Row("dashboard", "GET /sweeps/{id}/series", series_s * 1000, "ms", "",
            f"{series_kb:.0f} KiB, {max(16, 20_000 // trials)} points per trial at most; "
            f"median of {repeats}"),
    ]


if __name__ == "__main__":
    import sys

    for row in run("--smoke" in sys.argv):
        print(json.dumps(row.as_dict()))
