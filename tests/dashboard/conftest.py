"""The browser fixtures of the dashboard's tests: one Chromium per test module, a fresh page per
test that fails the test on any uncaught error in the page."""

from collections.abc import Iterator

import pytest

from tests.dashboard.browser import CHROMIUM, CHROMIUM_ARGS, UI_TIMEOUT_MS


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        yield b
        b.close()


@pytest.fixture
def page(browser):  # type: ignore[no-untyped-def]
    context = browser.new_context(viewport={"width": 1280, "height": 1000})
    pg = context.new_page()
    pg.set_default_timeout(UI_TIMEOUT_MS)
    errors: list[str] = []
    pg.on("pageerror", lambda exc: errors.append(str(exc)))
    yield pg
    context.close()
    assert not errors, f"uncaught errors in the page: {errors}"
