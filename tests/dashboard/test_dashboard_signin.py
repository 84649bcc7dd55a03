"""Signed in on the dashboard (Chromium): who it is (GET /me), what their role may not do is
not offered (a viewer has no Cancel, Pause or Submit), the job list's owner and team, and
signing out forgets the token. A real server in a thread with its supervisor off: the jobs stay
queued, nothing runs."""

from collections.abc import Iterator
from pathlib import Path

import pytest

from service.app import create_app
from service.settings import Settings
from tests.dashboard.browser import CHROMIUM, SCREENSHOTS
from tests.security.people import BOOTSTRAP, Cast, ThreadServer, make_cast, serve_in_thread

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="browser tests need Debian's Chromium at /usr/bin/chromium (apt-get install chromium)",
)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ThreadServer, Cast, int]]:
    home: Path = tmp_path_factory.mktemp("dash-signin") / "home"
    settings = Settings(home=home, cpu_slots=2, gpus="none", api_tokens=BOOTSTRAP)
    with serve_in_thread(create_app(settings, run_supervisor=False)) as server:
        with server.client(BOOTSTRAP) as boot:
            cast = make_cast(boot)
        with server.client(cast.member) as alice:
            job = alice.post("/jobs", json={"name": "queued-one", "dataset": "digits"}).json()
        yield server, cast, job["id"]


def _sign_in(page, server: ThreadServer, token: str, hash_: str) -> None:  # type: ignore[no-untyped-def]
    page.goto(f"{server.url}/#/")
    page.evaluate("t => localStorage.setItem('torchyard.token', t)", token)
    page.goto(f"{server.url}/{hash_}")
    page.reload()


def test_a_viewer_sees_no_cancel_pause_or_submit(world, page) -> None:  # type: ignore[no-untyped-def]
    server, cast, job_id = world
    _sign_in(page, server, cast.viewer, f"#/jobs/{job_id}")
    page.wait_for_function("() => document.getElementById('job-state')?.textContent === 'queued'")
    page.wait_for_function("() => document.getElementById('whoami')?.hidden === false")
    assert page.locator("#whoami").inner_text() == "vic · viewer · a"
    page.wait_for_timeout(1500)  # a poll or two: the buttons stay hidden
    assert page.locator("#cancel-button").is_hidden()
    assert page.locator("#pause-button").is_hidden()
    assert page.locator("#nav-submit").is_hidden()
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "viewer-job.png"), full_page=True)
    page.goto(f"{server.url}/#/")
    row = page.locator(f"tr[data-job-id='{job_id}']")
    row.wait_for()
    assert row.locator("td.owner").inner_text() == "alice"
    assert row.locator("td.team").inner_text() == "a"


def test_a_member_may_cancel_and_signing_out_forgets_the_token(world, page) -> None:  # type: ignore[no-untyped-def]
    server, cast, job_id = world
    _sign_in(page, server, cast.member, f"#/jobs/{job_id}")
    page.locator("#cancel-button").wait_for(state="visible")
    assert page.locator("#pause-button").is_visible()
    assert page.locator("#whoami").inner_text() == "alice · member · a"
    page.locator("#sign-out").click()
    page.locator("#token-form").wait_for(state="visible")
    assert page.evaluate("() => localStorage.getItem('torchyard.token')") is None
    assert page.locator("#whoami").is_hidden() and page.locator("#sign-out").is_hidden()
    assert page.locator("#signed-out").is_visible()
