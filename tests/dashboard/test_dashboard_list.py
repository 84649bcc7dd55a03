"""The job list in Chromium with more jobs than a page (issue 49): pages by cursor, a selection to
compare that survives paging, and the keyboard's place kept while the list refreshes.

The server is the real app under uvicorn in a thread with the supervisor off, so the jobs posted
stay queued and nothing runs (as tests/dashboard/test_dashboard_followers.py does)."""

import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
import uvicorn

from service.app import create_app
from service.settings import Settings
from tests.dashboard.browser import CHROMIUM

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="browser tests need Debian's Chromium at /usr/bin/chromium (apt-get install chromium)",
)
JOBS = 130  # a page is 100


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    settings = Settings(home=tmp_path_factory.mktemp("list") / "home", gpus="none", cpu_slots=2,
                        warm_ranks=False)
    app = create_app(settings, run_supervisor=False)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        assert thread.is_alive()
        time.sleep(0.05)
    base = f"http://127.0.0.1:{sock.getsockname()[1]}"
    try:
        with httpx.Client(base_url=base, timeout=10) as c:
            for i in range(JOBS):
                assert c.post("/jobs", json={"name": f"j{i + 1}", "dataset": "synthetic"}).status_code == 201
        yield base
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        sock.close()


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
