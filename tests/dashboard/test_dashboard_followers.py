"""The dashboard in a real browser, on data a job left (issue 17, finding 9): a job that reports only
per-step loss gets a chart, and a long log is followed from its tail, earlier parts on demand;
the nodes a job excludes are shown only when it has some (issue 25).

The server is the real app under uvicorn in a thread with the supervisor off; the records are
posted with the job's token and the log is a file where torchrun writes it, so no job has to run.
"""

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from service.app import create_app
from service.settings import Settings
from service.settings.tokens import new_token
from service.store import repository as repo
from tests.dashboard.browser import CHROMIUM, chart_traces
from tests.fixtures.threadserver import serve_in_thread
from torchyard_contract.rundir import RunDir

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="browser tests need Debian's Chromium at /usr/bin/chromium (apt-get install chromium)",
)
LOG_LINES = 3000  # ~120 KB: more than the 64 KiB the follower starts with


@pytest.fixture
def seeded(tmp_path: Path) -> Iterator[tuple[str, int]]:
    """(url, job id) of a finished 1-rank job with per-step loss only, a long rank-0 log, and
    two nodes its restarts left out (``retry_elsewhere`` on Slurm)."""
    settings = Settings(home=tmp_path / "home", gpus="none", cpu_slots=2)
    app = create_app(settings, run_supervisor=False)
    with serve_in_thread(app) as running:
        url = running.url
        with httpx.Client(base_url=url, timeout=10) as c:
            job_id = c.post("/jobs", json={"name": "steps", "dataset": "digits", "epochs": 1,
                                           "nproc_per_node": 1}).json()["id"]
            token, digest = new_token()
            with app.state.session_factory() as session:
                repo.transition(session, job_id, repo.JobState.starting, token_hash=digest)
                repo.set_attempts(session, job_id, [{
                    "number": 1, "started_at": time.time(), "ended_at": None, "exit_code": None,
                    "reason": None, "startup_failure": None}])
                session.commit()
            steps = [{"rank": 0, "epoch": 0, "step": s, "name": "loss", "value": 1 / (s + 1),
                      "time": time.time()} for s in range(50)]
            r = c.post(f"/jobs/{job_id}/records", json={"records": steps},
                       headers={"authorization": f"Bearer {token}"})
            assert r.json()["accepted"] == 50
        log = RunDir.for_job(settings.runs_dir, job_id).logs_dir / "attempt-1/run/attempt_0/0"
        log.mkdir(parents=True)
        lines = [f"line {i:05d} " + "." * 30 for i in range(LOG_LINES)]
        lines[-1] = "Traceback: THE-END"
        (log / "stderr.log").write_text("\n".join(lines) + "\n")
        with app.state.session_factory() as session:
            repo.transition(session, job_id, repo.JobState.failed, reason="rank 0 failed")
            job = repo.get_job(session, job_id)
            assert job is not None
            job.exclude_nodes = ["n1", "n2"]  # as restarts elsewhere on Slurm leave it
            session.commit()
        yield url, job_id


def test_per_step_only_job_is_charted_and_log_starts_at_the_tail(seeded, page) -> None:  # type: ignore[no-untyped-def]
    url, job_id = seeded
    page.goto(f"{url}/#/jobs/{job_id}")
    page.wait_for_function(
        "() => (document.getElementById('chart')?.data || []).some(t => t.meta.kind === 'rank')")
    ranks = [t for t in chart_traces(page) if t["kind"] == "rank"]
    assert [t["n"] for t in ranks] == [50], "the 50 per-step records, charted by step"
    assert "No \"loss\" records" not in page.locator("#chart-note").inner_text()

    page.wait_for_function(
        "() => document.getElementById('log-text')?.textContent.includes('THE-END')")
    shown = page.locator("#log-text").inner_text()
    assert "line 00000" not in shown, "the follower starts at the tail, not at offset 0"
    earlier = page.locator("#log-earlier")
    assert earlier.is_visible()
    while earlier.is_visible():
        earlier.click()
        page.wait_for_timeout(200)
    text = page.locator("#log-text").inner_text()
    assert text.startswith("line 00000") and text.rstrip().endswith("THE-END")
    assert text.count("line 01500 ") == 1, "no part loaded twice"


def test_excluded_nodes_are_shown_only_when_the_job_has_some(seeded, page) -> None:  # type: ignore[no-untyped-def]
    url, job_id = seeded
    page.goto(f"{url}/#/jobs/{job_id}")
    excluded = page.locator("#job-excluded")
    excluded.wait_for()
    assert excluded.inner_text() == "Excluded nodes: n1, n2"
    assert page.locator("#job-reason").inner_text() == "rank 0 failed"
    with httpx.Client(base_url=url, timeout=10) as c:  # queued for good: no supervisor runs
        plain = c.post("/jobs", json={"dataset": "digits", "epochs": 1}).json()["id"]
    page.goto(f"{url}/#/jobs/{plain}")
    page.wait_for_function(
        "() => document.getElementById('job-state')?.textContent.includes('queued')")
    assert page.locator("#job-excluded").is_hidden()
