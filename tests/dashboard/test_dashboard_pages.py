"""The dashboard's pages beyond the job list (issue 49) in Debian's Chromium, on real jobs of a
live server with API tokens: a sweep with a pruned trial, jobs compared, a job's outputs
downloaded through the page's link, its spec and "Submit a copy", the box (slots, the queue and
its reasons, warm ranks), keyboard-only use, a phone's viewport, and no console error or failed
request on any of them. Screenshots of every page go to ``SCREENSHOTS``.

One server for the module (2 CPU slots, so a 2-rank job fills the box and the next one waits);
its jobs are short script jobs (no torch in the script; warm ranks start them).
"""

import io
import json
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import LiveServer, _start_server, _stop_server, add_script
from tests.dashboard.browser import CHROMIUM, SCREENSHOTS

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="browser tests need Debian's Chromium at /usr/bin/chromium (apt-get install chromium)",
)
TOKEN = "dashboard-pages-api-token-0123456789abcdef"
SECRET_VALUE = "s3cr3t-value-never-shown"
SWEEP_TIMEOUT_S = 240.0
PHONE = {"width": 390, "height": 844}

# A trial: it reports, per epoch, its own job id plus a little of its parameters, so each later
# trial is worse than the ones before it: with two start-up trials the median rule prunes the
# third at its first epochs, whatever parameters the sampler draws.
TRIAL = '''\
import os
import sys
import time

import worker

lr, width, epochs, sleep_s = float(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
job = int(os.environ["TORCHYARD_JOB_ID"])
for epoch in range(1, epochs + 1):
    worker.report(epoch=epoch, loss=job + lr + width / 1000 / epoch)
    time.sleep(sleep_s)
'''

# A job with outputs: rank 0 keeps model.bin (written under a dot-name, then renamed: a listing
# never shows half a file) and a file in a subfolder; both ranks report a loss.
OUTPUTS = '''\
import os
import time

import worker

rank = int(os.environ["RANK"])
if rank == 0:
    out = os.environ["TORCHYARD_OUTPUT_DIR"]
    os.makedirs(os.path.join(out, "eval"), exist_ok=True)
    data = bytes((i * 7 + i // 256) % 256 for i in range(300_000))
    with open(os.path.join(out, ".model.bin"), "wb") as f:
        f.write(data)
    os.replace(os.path.join(out, ".model.bin"), os.path.join(out, "model.bin"))
    with open(os.path.join(out, "eval", "scores.json"), "w") as f:
        f.write('{"accuracy": 0.5}')
for epoch in (1, 2, 3):
    worker.report(epoch=epoch, loss=(1 + rank) / epoch, accuracy=0.3 * epoch)
    time.sleep(0.2)
'''

# Holds its slots until cancelled.
HOLD = '''\
import time

import worker

worker.report(epoch=1, loss=1.0)
time.sleep(600)
'''


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    root = tmp_path_factory.mktemp("pages")
    (root / "scripts").mkdir()
    secrets = root / "secrets.json"
    secrets.write_text(json.dumps({"hf": SECRET_VALUE}))
    secrets.chmod(0o600)
    srv = _start_server(root / "home", {
        "TORCHYARD_API_TOKENS": TOKEN, "TORCHYARD_SCRIPT_DIRS": str(root / "scripts"),
        "TORCHYARD_SECRETS_FILE": str(secrets), "TORCHYARD_CPU_SLOTS": "2",
    })
    for name, text in (("trial.py", TRIAL), ("hold.py", HOLD)):
        add_script(srv, name, text)
    yield srv
    _stop_server(srv)


def _shot(pg, name: str, full_page: bool = True) -> None:  # type: ignore[no-untyped-def]
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    pg.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=full_page)


def _open(pg, server: LiveServer, hash_: str) -> None:  # type: ignore[no-untyped-def]
    """The page at ``hash_`` with the server's token saved, as a user who pasted it once."""
    pg.add_init_script(f"localStorage.setItem('torchyard.token', '{TOKEN}')")
    pg.goto(f"{server.url}/{hash_}")


def _wait_sweep(server: LiveServer, sweep_id: int, until) -> dict:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + SWEEP_TIMEOUT_S
    with server.client() as c:
        while True:
            assert server.proc.poll() is None, server.log.read_text()[-3000:]
            sweep = c.get(f"/sweeps/{sweep_id}").json()
            if until(sweep):
                return sweep
            assert time.monotonic() < deadline, f"sweep {sweep_id}: {sweep}"
            time.sleep(0.3)


def _sweep_body(name: str, epochs: int, sleep_s: float, trials: int) -> dict:
    return {
        "name": name, "method": "random", "max_trials": trials, "parallel": 1, "seed": 4,
        "spec": {"entrypoint": "trial.py", "args": ["{lr}", "{width}", str(epochs), str(sleep_s)],
                 "device": "cpu"},
        "space": {"lr": {"type": "log_uniform", "low": 1e-4, "high": 1e-1},
                  "width": {"type": "choice", "values": [16, 32, 64]}},
        "prune": {"type": "median", "startup_trials": 2},
    }


@pytest.fixture(scope="module")
def pruned_sweep(server: LiveServer) -> dict:
    """A finished sweep of three trials, the third pruned: ``GET /sweeps/{id}/series``."""
    with server.client() as c:
        r = c.post("/sweeps", json=_sweep_body("pages", 4, 0.5, 3))
        assert r.status_code == 201, r.text
        sweep_id = r.json()["id"]
    done = _wait_sweep(server, sweep_id, lambda s: s["state"] != "running")
    assert done["state"] == "succeeded", done
    with server.client() as c:
        series = c.get(f"/sweeps/{sweep_id}/series").json()
    outcomes = [t["outcome"] for t in series["trials"]]
    assert outcomes == ["completed", "completed", "pruned"], series
    return series


@pytest.fixture(scope="module")
def outputs_job(server: LiveServer) -> dict:
    """A finished 2-rank job run from an uploaded package, with a secret and output files."""
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("outputs.py", OUTPUTS)
    with server.client() as c:
        r = c.post("/packages", content=archive.getvalue())
        assert r.status_code in (200, 201), r.text
        package = r.json()
        job = c.post("/jobs", json={
            "name": "with-outputs", "package": package["digest"], "entrypoint": "outputs.py",
            "nproc_per_node": 2, "device": "cpu", "secret_env": {"HF_TOKEN": "hf"},
            "labels": {"team": "vision"}}).json()
    done = server.wait_for(job["id"], {"succeeded"}, timeout_s=180)
    return {**done, "package": package}


def test_sweep_list_and_page_show_trials_the_pruned_one_the_best_and_charts(
        server, pruned_sweep, watched) -> None:  # type: ignore[no-untyped-def]
    pg, _ = watched
    sweep = pruned_sweep["sweep"]
    trials = {t["job_id"]: t for t in pruned_sweep["trials"]}
    pruned = next(t for t in trials.values() if t["outcome"] == "pruned")
    best = sweep["best"]

    _open(pg, server, "#/sweeps")
    row = pg.locator(f"tr[data-sweep-id='{sweep['id']}']")
    row.wait_for()
    text = row.inner_text()
    assert "pages" in text and "succeeded" in text and "2 completed · 1 pruned" in text, text
    assert f"(job {best['job_id']})" in text
    _shot(pg, "sweeps")

    row.locator("a").first.click()
    pg.wait_for_url(f"**/#/sweeps/{sweep['id']}")
    pg.locator("#trials-table tbody tr").nth(2).wait_for()
    # The charts once plotly.js is loaded (the last of the three drawn: every one is).
    pg.wait_for_function("() => !!document.getElementById('sweep-scatter')?.dataset.updates")
    rows = pg.locator("#trials-table tbody tr")
    assert rows.count() == 3
    headers = pg.locator("#trials-table thead th").all_inner_texts()
    assert "lr" in headers and "width" in headers, headers  # params as columns
    pruned_row = pg.locator(f"#trials-table tr[data-job-id='{pruned['job_id']}']")
    assert f"pruned at epoch {pruned['pruned_epoch']}" in pruned_row.inner_text()
    assert pruned["pruned_epoch"] < 4 and pruned["x"][-1] == pruned["pruned_epoch"]
    best_row = pg.locator("#trials-table tr.best")
    assert best_row.count() == 1 and best_row.get_attribute("data-job-id") == str(best["job_id"])
    assert pg.locator("#sweep-cancel").is_hidden()  # ended: nothing to cancel

    # Sortable by any column: by value, then by value descending (the missing value stays last).
    pg.locator("#trials-table button[data-sort='value']").click()
    ids = [int(i) for i in pg.locator("#trials-table tbody tr").evaluate_all(
        "rows => rows.map(r => r.dataset.jobId)")]
    by_value = sorted((t for t in trials.values() if t["value"] is not None),
                      key=lambda t: t["value"])
    assert ids == [t["job_id"] for t in by_value] + [pruned["job_id"]]
    pg.locator("#trials-table button[data-sort='value']").click()
    ids = [int(i) for i in pg.locator("#trials-table tbody tr").evaluate_all(
        "rows => rows.map(r => r.dataset.jobId)")]
    assert ids == [t["job_id"] for t in reversed(by_value)] + [pruned["job_id"]]
    assert pg.locator("#trials-table th[aria-sort='descending']").count() == 1

    # Every trial's objective per epoch on one chart; the pruned one ends where it stopped.
    lines = pg.evaluate("""() => document.getElementById('sweep-chart').data.map(
        t => ({job: t.meta.job_id, n: t.x.length, last: t.x[t.x.length - 1]}))""")
    assert {line["job"] for line in lines} == set(trials)
    assert {line["job"]: line["last"] for line in lines}[pruned["job_id"]] == pruned["pruned_epoch"]
    assert all(line["last"] == 4 for line in lines if line["job"] != pruned["job_id"])
    # Parallel coordinates of the params and the value; a scatter of lr on a log axis.
    parcoords = pg.evaluate("""() => document.getElementById('sweep-parcoords').data.map(
        t => t.meta)""")
    assert parcoords[-1]["dims"] == ["lr (log)", "width", "loss (min)"], parcoords
    assert sorted(j for t in parcoords[:-1] for j in t["trials"]) == sorted(
        t["job_id"] for t in trials.values() if t["outcome"] == "completed")
    assert pg.evaluate("() => document.getElementById('sweep-scatter').layout.xaxis.type") == "log"
    points = pg.evaluate("""() => document.getElementById('sweep-scatter').data.map(
        t => [t.meta.kind, t.x.length])""")
    assert points == [["completed", 2], ["pruned", 1]]
    assert pg.locator("#sweep-parcoords .scatterlayer .trace").count() == 3, "plotly drew it"
    _shot(pg, "sweep")

    # One click sends the trials to compare.
    pg.locator("#sweep-compare").click()
    pg.wait_for_url("**/#/compare?jobs=*")
    pg.wait_for_function("() => (document.getElementById('compare-chart-0')?.data || []).length === 3")
    assert sorted(pg.locator("#compare-table tbody tr").evaluate_all(
        "rows => rows.map(r => Number(r.dataset.jobId))")) == sorted(trials)


def test_a_trials_job_page_links_back_to_its_sweep_with_its_params(
        server, pruned_sweep, watched) -> None:  # type: ignore[no-untyped-def]
    pg, _ = watched
    trial = pruned_sweep["trials"][0]
    _open(pg, server, f"#/jobs/{trial['job_id']}")
    link = pg.locator("#job-sweep-link")
    link.wait_for()
    assert link.get_attribute("href") == f"#/sweeps/{pruned_sweep['sweep']['id']}"
    params = pg.locator("#job-params").inner_text()
    assert f"width = {trial['params']['width']}" in params and "lr = " in params
    link.click()
    pg.wait_for_url(f"**/#/sweeps/{pruned_sweep['sweep']['id']}")
    pg.locator("#trials-table").wait_for()


def test_a_running_sweep_updates_live_and_is_cancelled_from_its_page(
        server, watched) -> None:  # type: ignore[no-untyped-def]
    pg, _ = watched
    with server.client() as c:
        sweep_id = c.post("/sweeps", json=_sweep_body("live", 200, 0.4, 2)).json()["id"]
    try:
        _open(pg, server, f"#/sweeps/{sweep_id}")
        pg.evaluate("() => { window.sameDocument = true; }")
        grown = ("(n) => (document.getElementById('sweep-chart')?.data || [])"
                 ".some(t => t.x.length >= n)")
        pg.wait_for_function(grown, arg=1, timeout=120_000)
        pg.wait_for_function(grown, arg=3)  # more epochs arrive without a reload
        assert pg.evaluate("() => window.sameDocument") is True
        assert "running" in pg.locator("#trials-table").inner_text()
        _shot(pg, "sweep-running")
        pg.once("dialog", lambda d: d.accept())
        pg.locator("#sweep-cancel").click()
        done = _wait_sweep(server, sweep_id, lambda s: s["state"] != "running")
        assert done["state"] == "cancelled"
        pg.wait_for_function(
            "() => document.getElementById('sweep-state-badge')?.innerText === 'cancelled'")
        pg.locator("#sweep-cancel").wait_for(state="hidden")
        pg.wait_for_function(
            "() => !document.getElementById('trials-table')?.innerText.includes('running')")
    finally:
        with server.client() as c:
            c.post(f"/sweeps/{sweep_id}/cancel")


def test_outputs_download_byte_for_byte_and_the_spec_shows_secret_names_only(
        server, outputs_job, watched) -> None:  # type: ignore[no-untyped-def]
    pg, _ = watched
    job_id = outputs_job["id"]
    _open(pg, server, f"#/jobs/{job_id}")
    link = pg.locator("#output-rows a", has_text="model.bin")
    link.wait_for()
    rows = pg.locator("#output-rows tr").evaluate_all("rows => rows.map(r => r.dataset.path)")
    # The job's own files, and the TensorBoard event files the server wrote from its records.
    assert [r for r in rows if not r.startswith("tensorboard/")] == ["eval/scores.json", "model.bin"]
    assert any(r.startswith("tensorboard/events.out.tfevents.") for r in rows), rows
    assert "293 KiB" in pg.locator("#output-rows tr[data-path='model.bin']").inner_text()
    with pg.expect_download() as download:
        link.click()
    saved = Path(download.value.path())
    on_disk = server.home / "runs" / str(job_id) / "outputs" / "model.bin"
    assert saved.read_bytes() == on_disk.read_bytes() and len(on_disk.read_bytes()) == 300_000
    assert download.value.suggested_filename == "model.bin"
    with pg.expect_download() as download:
        pg.locator("#output-rows a", has_text="scores.json").click()
    assert Path(download.value.path()).read_text() == '{"accuracy": 0.5}'

    package = outputs_job["package"]
    pg.wait_for_function("() => document.getElementById('job-package')?.innerText.includes('files')")
    text = pg.locator("#job-package").inner_text()
    assert package["digest"] in text and "1 files" in text

    # The spec, read-only: the secret's variable and name, never its value.
    spec = json.loads(pg.locator("#job-spec").inner_text())
    assert spec["secret_env"] == {"HF_TOKEN": "hf"} and spec["package"] == package["digest"]
    assert "HF_TOKEN" in pg.locator("#job-secrets").inner_text()
    assert SECRET_VALUE not in pg.content()
    pg.wait_for_function(
        "() => (document.getElementById('chart')?.data || []).some(t => t.meta.kind === 'mean')")
    _shot(pg, "job")
    pg.evaluate("() => window.scrollTo(0, 0)")  # the downloads scrolled to the outputs
    _shot(pg, "job-top", full_page=False)  # the README's first screen

    # "Submit a copy": the form pre-filled with the spec; submitted, it is the same job again.
    pg.locator("#copy-button").click()
    pg.wait_for_url(f"**/#/submit?copy={job_id}")
    pg.wait_for_function("() => (document.getElementById('spec-json')?.value ?? '').includes('outputs.py')")
    assert json.loads(pg.locator("#spec-json").input_value()) == outputs_job["spec"]
    assert pg.locator("h1").inner_text() == f"Submit a copy of job {job_id}"
    _shot(pg, "submit-copy")
    pg.click("#submit-button")
    pg.wait_for_url("**/#/jobs/*")
    copy_id = int(pg.url.rsplit("/", 1)[1])
    with server.client() as c:
        copy = c.get(f"/jobs/{copy_id}").json()
        c.post(f"/jobs/{copy_id}/cancel")
    assert copy_id != job_id and copy["spec"] == outputs_job["spec"]


def test_two_jobs_ticked_in_the_list_are_compared(
        server, pruned_sweep, outputs_job, watched) -> None:  # type: ignore[no-untyped-def]
    pg, _ = watched
    trial = pruned_sweep["trials"][0]
    a, b = outputs_job["id"], trial["job_id"]
    _open(pg, server, "#/")
    for job_id in (a, b):
        box = pg.locator(f"tr[data-job-id='{job_id}'] input.select-job")
        box.wait_for()
        box.check()
    assert pg.locator("#compare-button").inner_text() == "Compare 2 job(s)"
    _shot(pg, "job-list-selected")
    pg.locator("#compare-button").click()
    pg.wait_for_url("**/#/compare?jobs=*")
    chart = "document.getElementById('compare-chart-0')"
    pg.wait_for_function(f"() => ({chart}?.data || []).length === 2")
    means = pg.evaluate(f"() => {chart}.data.map(t => [t.meta.kind, t.meta.job_id, t.x.length])")
    assert sorted(means) == sorted([["mean", a, 3], ["mean", b, 4]])

    # Final values: each job's cross-rank mean at its last epoch, as the API computes it.
    with server.client() as c:
        for job_id in (a, b):
            mean = c.get(f"/jobs/{job_id}/series", params={"name": "loss"}).json()["mean"]
            cell = pg.locator(f"#compare-table tr[data-job-id='{job_id}'] td.final").inner_text()
            assert cell.startswith(f"{mean['y'][-1]:.5g}"), cell
            assert f"@{mean['x'][-1]}" in cell
    diff = pg.locator("#diff-table tbody tr").evaluate_all("rows => rows.map(r => r.dataset.field)")
    assert "entrypoint" in diff and "nproc_per_node" in diff and "lr" not in diff, diff

    # Per-rank lines on request: the 2-rank job's two and the trial's one.
    pg.locator("#compare-ranks").check()
    pg.wait_for_function(f"() => {chart}.data.length === 5")
    ranks = pg.evaluate(f"() => {chart}.data.filter(t => t.meta.kind === 'rank').map(t => t.meta.job_id)")
    assert sorted(ranks) == sorted([a, a, b])
    assert "ranks=1" in pg.url
    # Another metric: a second chart (only the 2-rank job reports accuracy).
    pg.locator("#compare-metrics input[value='accuracy']").check()
    pg.wait_for_function("() => (document.getElementById('compare-chart-1')?.data || [])"
                         ".some(t => t.meta.kind === 'mean')")
    _shot(pg, "compare")


def test_resources_show_the_holder_and_the_waiting_reason_and_cancel_by_keyboard(
        server, watched) -> None:  # type: ignore[no-untyped-def]
    pg, _ = watched
    with server.client() as c:
        holder = c.post("/jobs", json={"name": "holder", "entrypoint": "hold.py",
                                       "nproc_per_node": 2, "device": "cpu"}).json()["id"]
        try:
            server.wait_for(holder, {"running"})
            waiter = c.post("/jobs", json={"name": "waiter", "entrypoint": "hold.py",
                                           "device": "cpu"}).json()["id"]
            deadline = time.monotonic() + 30
            while not (job := c.get(f"/jobs/{waiter}").json())["waiting_reason"]:
                assert time.monotonic() < deadline, job
                time.sleep(0.2)
            reason = job["waiting_reason"]
            assert "needs 1 CPU slot" in reason, reason

            _open(pg, server, "#/resources")
            queued = pg.locator(f"#queue-table tr[data-job-id='{waiter}']")
            queued.wait_for()
            assert queued.locator(".waiting-reason").inner_text() == reason
            assert "waiter" in queued.inner_text()
            held = pg.locator("#slot-table tr.held")
            pg.wait_for_function(
                "() => document.querySelectorAll('#slot-table tr.held').length === 2")
            assert all("holder" in t for t in held.all_inner_texts())
            assert "2 of 2 in use" in pg.locator("#resource-totals").inner_text()
            assert pg.locator("#warm-state").inner_text() in ("ready", "starting")
            _shot(pg, "resources")

            # The keyboard alone: Tab to Cancel on the holder's page (its focus visible), Enter.
            pg.goto(f"{server.url}/#/jobs/{holder}")
            pg.locator("#cancel-button").wait_for()
            for _ in range(40):
                pg.keyboard.press("Tab")
                if pg.evaluate("() => document.activeElement.id") == "cancel-button":
                    break
            else:
                pytest.fail("Tab never reached the Cancel button")
            focus = pg.evaluate("""() => { const s = getComputedStyle(document.activeElement);
                return {visible: document.activeElement.matches(':focus-visible'),
                        style: s.outlineStyle, width: parseFloat(s.outlineWidth)}; }""")
            assert focus["visible"] and focus["style"] != "none" and focus["width"] >= 2, focus
            _shot(pg, "keyboard-cancel-focus")
            pg.once("dialog", lambda d: d.accept())
            pg.keyboard.press("Enter")
            assert server.wait_for(holder, {"cancelled"}, timeout_s=60)["state"] == "cancelled"
            pg.wait_for_function(
                "() => document.getElementById('job-state')?.innerText === 'cancelled'")
        finally:
            for job_id in (holder, locals().get("waiter")):
                if job_id:
                    c.post(f"/jobs/{job_id}/cancel")


PAGES = ["#/", "#/jobs/{job}", "#/sweeps", "#/sweeps/{sweep}", "#/compare?jobs={job},{trial}",
         "#/resources", "#/teams", "#/submit"]


def test_every_page_fits_a_phone(server, pruned_sweep, outputs_job, browser) -> None:  # type: ignore[no-untyped-def]
    """At 390 px: the page is never wider than the screen (a wide table scrolls in its own box),
    the header's items do not overlap, and nothing errs."""
    context = browser.new_context(viewport=PHONE, is_mobile=True, has_touch=True)
    pg = context.new_page()
    errors: list[str] = []
    pg.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    pg.on("pageerror", lambda exc: errors.append(str(exc)))
    pg.add_init_script(f"localStorage.setItem('torchyard.token', '{TOKEN}')")
    ids = {"job": outputs_job["id"], "sweep": pruned_sweep["sweep"]["id"],
           "trial": pruned_sweep["trials"][0]["job_id"]}
    try:
        for hash_ in PAGES:
            pg.goto(f"{server.url}/{hash_.format(**ids)}")
            pg.wait_for_function("() => document.querySelector('#view').children.length > 1")
            pg.wait_for_timeout(800)  # one refresh drawn (tables, charts)
            layout = pg.evaluate("""() => {
                const vw = document.documentElement.clientWidth;
                const over = [...document.querySelectorAll('main *')].filter(el => {
                    const r = el.getBoundingClientRect();
                    if (!r.width || r.right <= vw + 1) return false;
                    return !el.parentElement.closest('.scroll, table, .js-plotly-plot, pre');  // in a box
                }).map(el => el.tagName + '#' + el.id + '.' + el.className);
                const head = [...document.querySelectorAll('header > *, header nav a')]
                    .filter(el => el.offsetParent !== null).map(el => el.getBoundingClientRect());
                let overlaps = 0;
                for (let i = 0; i < head.length; i++) for (let j = i + 1; j < head.length; j++) {
                    const a = head[i], b = head[j];
                    const nested = (a.left <= b.left && a.right >= b.right && a.top <= b.top
                                    && a.bottom >= b.bottom) || (b.left <= a.left
                                    && b.right >= a.right && b.top <= a.top && b.bottom >= a.bottom);
                    if (!nested && a.left < b.right - 1 && b.left < a.right - 1
                        && a.top < b.bottom - 1 && b.top < a.bottom - 1) overlaps++;
                }
                const scrolls = [...document.querySelectorAll('.scroll')].every(
                    s => s.getBoundingClientRect().right <= vw + 1);
                return {page: document.documentElement.scrollWidth, vw, over, overlaps, scrolls};
            }""")
            assert layout["page"] <= layout["vw"], (hash_, layout)
            assert not layout["over"] and not layout["overlaps"] and layout["scrolls"], (hash_, layout)
            name = hash_.split("?")[0].strip("#/").replace("/", "-").replace("{", "").replace("}", "")
            _shot(pg, f"phone-{name or 'jobs'}")
    finally:
        context.close()
    assert not errors, errors
