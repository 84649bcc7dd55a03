"""The job list in Chromium with more jobs than a page (issue 49): pages by cursor, a selection to
compare that survives paging, and the keyboard's place kept while the list refreshes; and a
sweep with more trials than the page draws one line each for.

The server is the real app under uvicorn in a thread with the supervisor off, so the jobs posted
stay queued and nothing runs (as tests/dashboard/test_dashboard_followers.py does)."""

from collections.abc import Iterator

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import insert

from service.app import create_app
from service.domain.sweeps.spec import SweepSpec
from service.settings import Settings
from service.store import records as recordstore
from service.store import repository as repo
from service.store import sweeps as sweepstore
from service.store.tables import MetricRecord
from tests.dashboard.browser import CHROMIUM
from tests.fixtures.threadserver import serve_in_thread
from torchyard_contract.state import JobState

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="browser tests need Debian's Chromium at /usr/bin/chromium (apt-get install chromium)",
)
JOBS = 130  # a page is 100


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, FastAPI]]:
    settings = Settings(home=tmp_path_factory.mktemp("list") / "home", gpus="none", cpu_slots=2,
                        warm_ranks=False)
    app = create_app(settings, run_supervisor=False)
    with serve_in_thread(app) as running:
        base = running.url
        with httpx.Client(base_url=base, timeout=10) as c:
            for i in range(JOBS):
                assert c.post("/jobs", json={"name": f"j{i + 1}", "dataset": "synthetic"}).status_code == 201
        yield base, app


@pytest.fixture
def url(served: tuple[str, FastAPI]) -> str:
    return served[0]


def _ids(pg) -> list[int]:  # type: ignore[no-untyped-def]
    return [int(i) for i in pg.locator("#job-rows tr").evaluate_all(
        "rows => rows.map(r => r.dataset.jobId)")]


def test_the_list_pages_by_cursor_and_keeps_a_selection_across_pages(url: str, watched) -> None:  # type: ignore[no-untyped-def]
    pg, _ = watched
    pg.goto(f"{url}/#/")
    pg.wait_for_function("() => document.querySelectorAll('#job-rows tr').length === 100")
    assert _ids(pg) == list(range(JOBS, JOBS - 100, -1)), "newest first"
    assert pg.locator("#page-newest").count() == 0
    pg.locator(f"tr[data-job-id='{JOBS}'] input.select-job").check()

    pg.locator("#page-older").click()
    pg.wait_for_url(f"**/#/?before={JOBS - 99}")
    pg.wait_for_function("() => document.querySelectorAll('#job-rows tr').length === 30")
    assert _ids(pg) == list(range(30, 0, -1))
    assert pg.locator("#page-older").count() == 0, "the last page"
    pg.locator("tr[data-job-id='7'] input.select-job").check()
    assert pg.locator("#compare-button").inner_text() == "Compare 2 job(s)"

    pg.locator("#page-newest").click()
    pg.wait_for_function("() => document.querySelectorAll('#job-rows tr').length === 100")
    assert pg.locator(f"tr[data-job-id='{JOBS}'] input.select-job").is_checked()
    pg.locator("#compare-button").click()
    pg.wait_for_url(f"**/#/compare?jobs={JOBS},7")
    # Queued jobs compared: no records yet, and the specs differ in their names only.
    pg.wait_for_function("() => document.querySelectorAll('#diff-table tbody tr').length === 1")
    assert pg.locator("#diff-table tbody tr").get_attribute("data-field") == "name"


def test_a_refresh_of_the_list_keeps_the_keyboard_where_it_was(url: str, watched) -> None:  # type: ignore[no-untyped-def]
    pg, _ = watched
    pg.goto(f"{url}/#/?state=queued")
    box = pg.locator("tr[data-job-id='50'] input.select-job")
    box.wait_for()
    box.focus()
    box.evaluate("el => { el.dataset.before = 'yes'; }")  # gone once the row is drawn anew
    pg.wait_for_function("""() => !document.querySelector("tr[data-job-id='50'] input")
        .dataset.before""")
    assert pg.evaluate("() => document.activeElement.getAttribute('data-focus')") == "sel-50"
    pg.keyboard.press("Space")
    assert pg.locator("tr[data-job-id='50'] input.select-job").is_checked()


def _stored_sweep(app: FastAPI, trials: int) -> tuple[int, list[int], list[int]]:
    """(sweep id, completed trials, pruned trials): 6 epochs of one rank each, one trial in
    five pruned at epoch 3 (stored rows: the read path, not the driver)."""
    spec = SweepSpec.model_validate({
        "name": "many", "spec": {"dataset": "synthetic"}, "max_trials": trials,
        "space": {"lr": {"type": "log_uniform", "low": 1e-4, "high": 1.0},
                  "model": {"type": "choice", "values": ["mlp", "cnn"]}},
    })
    done, pruned, rows = [], [], []
    with app.state.session_factory() as session:
        sweep = sweepstore.create_sweep(session, "many", 0, spec.model_dump(mode="json"))
        for n in range(1, trials + 1):
            params = {"lr": 10 ** (-4 + 4 * n / trials), "model": ["mlp", "cnn"][n % 2]}
            job = repo.create_job(session, spec.trial_spec(sweep.id, n, params))
            sweepstore.mark_trial(session, job.id, sweep.id, n, params)
            repo.transition(session, job.id, JobState.starting)
            rows += [{"job_id": job.id, "attempt": 1, "rank": 0, "epoch": e,
                      "step": recordstore.EPOCH_STEP, "name": "loss", "value": n / e,
                      "nonfinite": None, "time": 0.0} for e in range(1, 7)]
            if n % 5 == 0:
                assert sweepstore.prune_trial(session, job.id, 3, "pruned at epoch 3")
                pruned.append(job.id)
            else:
                repo.transition(session, job.id, JobState.succeeded)
                done.append(job.id)
        session.execute(insert(MetricRecord), rows)
        sweepstore.end_sweep(session, sweep.id, "succeeded", None)
        session.commit()
        return sweep.id, done, pruned


def test_a_sweep_of_many_trials_draws_them_grouped_and_names_each(served, watched) -> None:  # type: ignore[no-untyped-def]
    url, app = served
    sweep_id, done, pruned = _stored_sweep(app, 25)
    pg, _ = watched
    pg.goto(f"{url}/#/sweeps/{sweep_id}")
    pg.wait_for_function("() => document.querySelectorAll('#trials-table tbody tr').length === 25")
    pg.wait_for_function("() => !!document.getElementById('sweep-scatter')?.dataset.updates")
    groups = pg.evaluate("""() => document.getElementById('sweep-chart').data.map(t => t.meta)""")
    assert [g["group"] for g in groups[:-1]] == ["completed", "pruned"], groups
    assert groups[-1]["kind"] == "trial" and groups[-1]["job_id"] == done[0], "the best: lowest loss"
    assert sorted(groups[0]["trials"] + [groups[-1]["job_id"]]) == sorted(done)
    assert sorted(groups[1]["trials"]) == sorted(pruned)
    pruned_x = pg.evaluate("() => document.getElementById('sweep-chart').data[1].x")
    assert pruned_x == [1, 2, 3, None] * len(pruned), "each pruned line ends at its epoch"
    hover = pg.evaluate("() => document.getElementById('sweep-chart').data[1].text")
    assert hover[0] == f"trial {pruned[0]}"
    bands = pg.evaluate("() => document.getElementById('sweep-parcoords').data.map(t => t.meta)")
    assert sorted(j for b in bands[:-1] for j in b["trials"]) == sorted(done)
    assert 1 < len(bands) - 1 <= 8 and bands[-1]["dims"] == ["lr (log)", "model", "loss (min)"]
    assert pg.evaluate("() => document.getElementById('sweep-scatter').layout.xaxis.type") == "log"
    pg.select_option("#scatter-param", "model")
    pg.wait_for_function(
        "() => document.getElementById('sweep-scatter')?.layout?.xaxis?.type === 'category'")
