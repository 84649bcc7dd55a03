"""The dashboard in a real browser: Playwright driving Debian's Chromium against a live server with
real torchrun jobs. Screenshots go to ``test-output/dashboard/``.

Chromium comes from Debian (``apt-get install chromium``, done by ``.ci/run``), never from
``playwright install``; without ``/usr/bin/chromium`` these tests are skipped, saying why. The
``browser`` and ``page`` fixtures are in ``tests/dashboard/conftest.py``.
"""

from collections.abc import Iterator

import pytest

from tests.conftest import REPO_ROOT, LiveServer, _start_server, _stop_server, add_script
from tests.dashboard.browser import CHROMIUM, SCREENSHOTS, chart_traces

LONG_JOB = {"name": "long", "dataset": "synthetic", "epochs": 1000, "nproc_per_node": 2,
            "labels": {"team": "ui"}}

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="browser tests need Debian's Chromium at /usr/bin/chromium (apt-get install chromium)",
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    # Every epoch sleeps 1 s, so a long job is visibly running while the page watches it.
    srv = _start_server(tmp_path_factory.mktemp("dash") / "home",
                        {"TORCHYARD_TEST_EPOCH_SLEEP_S": "1"})
    yield srv
    _stop_server(srv)


def _shot(pg, name: str) -> None:  # type: ignore[no-untyped-def]
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    pg.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)


def test_finished_two_rank_job_shows_one_curve_per_rank_and_the_mean(server, page) -> None:  # type: ignore[no-untyped-def]
    with server.client() as c:
        job_id = c.post("/jobs", json={"name": "digits-ddp", "dataset": "digits", "epochs": 3,
                                       "nproc_per_node": 2}).json()["id"]
    server.wait_for(job_id, {"succeeded"}, timeout_s=240)

    page.goto(f"{server.url}/#/jobs/{job_id}")
    page.wait_for_function(
        "() => (document.getElementById('chart')?.data || []).some(t => t.meta.kind === 'mean')")
    traces = chart_traces(page)
    ranks = [t for t in traces if t["kind"] == "rank"]
    assert sorted(t["rank"] for t in ranks) == [0, 1], traces
    assert [t["name"] for t in ranks] == ["rank 0", "rank 1"]
    assert all(t["n"] == 3 for t in ranks), "epochs 1..3 of each rank"
    assert [t["n"] for t in traces if t["kind"] == "mean"] == [3]
    assert page.locator("#chart .scatterlayer .trace").count() == 3, "plotly drew three lines"
    assert page.locator("#job-state").inner_text() == "succeeded"
    assert page.locator("#cancel-button").is_hidden()
    phases = page.locator("#phases").inner_text()
    assert "queued" in phases and "rendezvous done" in phases and "ended" in phases
    page.wait_for_function("() => (document.getElementById('log-note')?.textContent ?? '') !== ''")
    _shot(page, "finished-job")

    page.goto(f"{server.url}/#/?state=succeeded")
    row = page.locator(f"tr[data-job-id='{job_id}']")
    row.wait_for()
    assert "3 / 3" in row.inner_text() and "succeeded" in row.inner_text()
    _shot(page, "job-list")


def test_running_job_chart_grows_without_reload(server, page) -> None:  # type: ignore[no-untyped-def]
    with server.client() as c:
        job_id = c.post("/jobs", json=LONG_JOB).json()["id"]
        try:
            server.wait_for(job_id, {"running"}, timeout_s=120)
            page.goto(f"{server.url}/#/jobs/{job_id}")
            page.evaluate("() => { window.sameDocument = true; }")  # gone if the page reloads
            page.wait_for_function(
                "() => (document.getElementById('chart')?.data || [])"
                ".filter(t => t.meta.kind === 'rank' && t.x.length >= 1).length === 2")
            before = min(t["n"] for t in chart_traces(page) if t["kind"] == "rank")
            page.wait_for_function(
                "(n) => (document.getElementById('chart')?.data || [])"
                ".filter(t => t.meta.kind === 'rank' && t.x.length >= n).length === 2",
                arg=before + 2)
            after = min(t["n"] for t in chart_traces(page) if t["kind"] == "rank")
            assert after >= before + 2
            assert page.evaluate("() => window.sameDocument") is True, "the page was reloaded"
            assert page.locator("#job-state").inner_text() == "running"
            _shot(page, "running-job")
        finally:
            c.post(f"/jobs/{job_id}/cancel")


def test_cancel_button_cancels_the_job(server, page) -> None:  # type: ignore[no-untyped-def]
    with server.client() as c:
        job_id = c.post("/jobs", json=LONG_JOB).json()["id"]
    server.wait_for(job_id, {"running"}, timeout_s=120)
    page.goto(f"{server.url}/#/jobs/{job_id}")
    page.once("dialog", lambda dialog: dialog.accept())  # the "Cancel job N?" confirmation
    page.locator("#cancel-button").click()
    job = server.wait_for(job_id, {"cancelled"}, timeout_s=30)
    assert job["state"] == "cancelled"
    page.wait_for_function("() => document.getElementById('job-state')?.innerText === 'cancelled'")
    page.locator("#cancel-button").wait_for(state="hidden")
    _shot(page, "cancelled-job")


def test_pause_and_resume_buttons(server, page) -> None:  # type: ignore[no-untyped-def]
    with server.client() as c:
        job_id = c.post("/jobs", json=LONG_JOB).json()["id"]
        try:
            server.wait_for(job_id, {"running"}, timeout_s=120)
            page.goto(f"{server.url}/#/jobs/{job_id}")
            page.locator("#pause-button").click()
            server.wait_for(job_id, {"paused"}, timeout_s=60, allowed={"running", "pausing"})
            page.wait_for_function(
                "() => document.getElementById('job-state')?.innerText === 'paused'")
            page.locator("#pause-button").wait_for(state="hidden")
            _shot(page, "paused-job")
            page.locator("#resume-button").click()
            job = server.wait_for(job_id, {"running"}, timeout_s=120,
                                  allowed={"paused", "queued", "starting"})
            assert job["pauses"] == 1 and job["attempts"][0]["paused"] is True
            page.wait_for_function(
                "() => document.getElementById('job-state')?.innerText === 'running'")
            page.locator("#resume-button").wait_for(state="hidden")
            assert page.locator("#pause-button").is_visible()
        finally:
            c.post(f"/jobs/{job_id}/cancel")


def test_submit_form_creates_a_job_and_shows_validation_errors(server, page) -> None:  # type: ignore[no-untyped-def]
    page.goto(f"{server.url}/#/submit")
    page.fill("#spec-json", '{"dataset": "synthetic", "epochs": 0}')
    page.click("#submit-button")
    page.locator("#submit-errors li").first.wait_for()
    assert "epochs" in page.locator("#submit-errors").inner_text()
    page.fill("#spec-json", '{"name": "from-form", "dataset": "synthetic", "epochs": 1}')
    page.click("#submit-button")
    page.wait_for_url("**/#/jobs/*")
    job_id = int(page.url.rsplit("/", 1)[1])
    with server.client() as c:
        assert c.get(f"/jobs/{job_id}").json()["name"] == "from-form"
    server.wait_for(job_id, {"succeeded"}, timeout_s=180)


def test_nan_stopped_job_shows_why_it_stopped(server, page) -> None:  # type: ignore[no-untyped-def]
    """``lr: 90`` gives NaN from epoch 1: the loss guard fails the job, the page says why."""
    with server.client() as c:
        job_id = c.post("/jobs", json={"name": "nan-loss", "dataset": "synthetic", "lr": 90,
                                       "epochs": 1000}).json()["id"]
    server.wait_for(job_id, {"failed"}, timeout_s=180)
    page.goto(f"{server.url}/#/jobs/{job_id}")
    page.wait_for_function("() => document.getElementById('job-state')?.innerText === 'failed'")
    reason = "rank 0 reported loss NaN at epoch 1"
    page.wait_for_function(
        "(r) => document.getElementById('job-reason')?.innerText === r", arg=reason)
    page.wait_for_function(
        "() => document.getElementById('chart-note')?.textContent.includes('NaN at epoch 1')")
    assert page.locator("#cancel-button").is_hidden()
    # Once the group is stopped, the attempt says why it ended too.
    page.wait_for_function(
        "(r) => document.getElementById('attempts')?.innerText.includes(r)", arg=reason)
    _shot(page, "nan-stopped-job")


@pytest.fixture
def script_server(shared_script_server: LiveServer) -> LiveServer:
    """A server that runs script jobs (they need API tokens): the session's shared one; the
    test opens its own job's page only."""
    add_script(shared_script_server, "losses.py",
               (REPO_ROOT / "tests" / "jobs" / "losses.py").read_text())
    return shared_script_server


def test_script_job_output_shows_prints_and_logs_live_in_order(script_server, page) -> None:  # type: ignore[no-untyped-def]
    """The log panel shows everything a rank wrote — its prints (stdout) and its logging
    (stderr) — in the order written, growing while the job runs; one stream on request."""
    epochs = 12
    losses = ",".join(f"{1 / e:.3f}" for e in range(1, epochs + 1))
    with script_server.client() as c:  # LiveServer.client sends the first API token
        job_id = c.post("/jobs", json={"name": "prints", "entrypoint": "losses.py",
                                       "nproc_per_node": 2, "args": [losses, "1"]}).json()["id"]
    try:
        script_server.wait_for(job_id, {"running"}, timeout_s=120)
        page.add_init_script(f"localStorage.setItem('torchyard.token', '{script_server.token}')")
        page.goto(f"{script_server.url}/#/jobs/{job_id}")
        page.evaluate("() => { window.sameDocument = true; }")
        page.wait_for_function(
            "() => (document.getElementById('log-text')?.textContent ?? '').includes('Epoch 2,')")
        assert page.locator("#job-state").inner_text() == "running"
        page.wait_for_function(  # live: more lines arrive without a reload
            "() => (document.getElementById('log-text')?.textContent ?? '').includes('Epoch 4,')")
        assert page.evaluate("() => window.sameDocument") is True
        text = page.locator("#log-text").text_content()
        for epoch in (1, 2, 3):
            printed = text.index(f"Rank 0, Epoch {epoch}, Loss:")
            logged = text.index(f"rank0 INFO epoch {epoch} reported")
            assert printed < logged < text.index(f"Rank 0, Epoch {epoch + 1}, Loss:"), text
        _shot(page, "script-job-output")

        page.select_option("#log-stream", "stdout")
        page.wait_for_function(
            "() => (document.getElementById('log-text')?.textContent ?? '').includes('Epoch 1,')")
        only = page.locator("#log-text").text_content()
        assert "Rank 0, Epoch 1, Loss:" in only and "INFO" not in only
    finally:
        with script_server.client() as c:
            c.post(f"/jobs/{job_id}/cancel")
