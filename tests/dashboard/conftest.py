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


class Problems(list):
    """What a page must never show with a valid token: console errors (Chromium logs every
    failed load there, the browser's own ``/favicon.ico`` included), uncaught errors, failed
    requests and answers of 400 or more. ``allow(status, part)`` lets one expected answer by."""

    def __init__(self) -> None:
        super().__init__()
        self.allowed: list[tuple[int, str]] = []

    def allow(self, status: int, url_part: str) -> None:
        self.allowed.append((status, url_part))

    def response(self, status: int, url: str) -> None:
        if status >= 400 and not any(s == status and p in url for s, p in self.allowed):
            self.append(f"HTTP {status} {url}")

    def console(self, kind: str, text: str) -> None:
        allowed = any(f"status of {s}" in text for s, _ in self.allowed)
        if kind == "error" and not allowed:
            self.append(f"console error: {text}")


@pytest.fixture
def watched(browser):  # type: ignore[no-untyped-def]
    """``(page, problems)``: a 1280×800 page whose console errors, failed requests and 4xx/5xx
    answers are collected; the test fails at the end if there are any (``problems.allow`` for
    one it provokes)."""
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    pg = context.new_page()
    pg.set_default_timeout(UI_TIMEOUT_MS)
    problems = Problems()
    pg.on("pageerror", lambda exc: problems.append(f"uncaught: {exc}"))
    pg.on("console", lambda m: problems.console(m.type, m.text))
    pg.on("response", lambda r: problems.response(r.status, r.url))
    pg.on("requestfailed", lambda r: problems.append(f"failed: {r.url} {r.failure}"))
    yield pg, problems
    context.close()
    assert not problems, f"the page had problems: {problems}"
