"""The API reference (``/docs``) in a real browser: Playwright driving Debian's Chromium against a
live ``torchyard serve`` with API tokens, every request outside that server refused (no CDN, no
validator badge). Skipped, saying why, without ``/usr/bin/chromium`` (as tests/dashboard/).
"""

import json
from urllib.parse import urlparse

import pytest

from tests.conftest import LiveServer
from tests.dashboard.browser import CHROMIUM, CHROMIUM_ARGS, SCREENSHOTS, UI_TIMEOUT_MS

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="browser tests need Debian's Chromium at /usr/bin/chromium (apt-get install chromium)",
)


@pytest.fixture
def server(shared_script_server: LiveServer) -> LiveServer:
    """The shared server with API tokens (its token is what the page is given)."""
    return shared_script_server


@pytest.fixture
def offline_page(server: LiveServer):  # type: ignore[no-untyped-def]
    """A page that can reach only the server: anything else is aborted and recorded."""
    from playwright.sync_api import sync_playwright

    outside: list[str] = []
    errors: list[str] = []
    here = urlparse(server.url).netloc

    def gate(route) -> None:  # type: ignore[no-untyped-def]
        if urlparse(route.request.url).netloc == here:
            route.continue_()
        else:
            outside.append(route.request.url)
            route.abort()

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS,
                                     headless=True)
        context = browser.new_context(viewport={"width": 1280, "height": 1000})
        context.route("**/*", gate)
        page = context.new_page()
        page.set_default_timeout(UI_TIMEOUT_MS)
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        yield page
        context.close()
        browser.close()
    assert outside == [], f"the page tried to leave the server: {outside}"
    assert errors == [], f"uncaught errors in the page: {errors}"


def test_docs_open_offline_and_work_with_the_dashboards_token(server: LiveServer,
                                                              offline_page) -> None:  # type: ignore[no-untyped-def]
    page = offline_page
    # The dashboard links the reference; a plain navigation needs no token (the shell is public).
    page.goto(f"{server.url}/")
    page.get_by_role("link", name="API").click()
    page.wait_for_url(f"{server.url}/docs")
    # No token yet: /openapi.json is 401, and the page asks for one, as the dashboard does.
    page.locator("#token-form").wait_for(state="visible")
    assert "401" in page.locator("#token-message").inner_text()
    page.fill("#token-input", server.token or "")
    page.locator("#token-form button[type=submit]").click()
    page.wait_for_load_state()

    # Swagger UI rendered every operation of the document.
    with server.client() as c:
        document = c.get("/openapi.json").json()
    operations = sum(len(ops) for ops in document["paths"].values())
    page.wait_for_function(f"() => document.querySelectorAll('.opblock').length >= {operations}")
    assert page.locator(".swagger-ui .info .title").inner_text().startswith("torchyard")
    assert page.evaluate("() => localStorage.getItem('torchyard.token')") == server.token

    # "Try it out" on an operation behind the token: the stored token goes with the call.
    block = page.locator("#operations-scheduling-read_resources")
    block.locator(".opblock-summary").click()
    block.locator(".try-out__btn").click()
    block.locator(".execute").click()
    status = block.locator(".live-responses-table tr.response .response-col_status").first
    status.wait_for()
    assert status.inner_text().strip() == "200"
    body = block.locator(".live-responses-table tr.response .microlight").first.inner_text()
    assert json.loads(body)["cpu"]["total"] == 4
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "api-docs.png"), full_page=False)

    # The same token serves the dashboard: it opens without asking.
    page.goto(f"{server.url}/")
    page.locator("#view h1").wait_for()
    assert page.locator("#token-form").is_hidden()
