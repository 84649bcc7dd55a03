"""The dashboard's teams page (``#/teams``, issue 47) in Debian's Chromium: each team's slots
and slot-hours against its quota and budget, the budget's reason when it is spent, the
fair-share rank, this month's usage by user, and a member seeing their own team only — with no
console error or failed request. No job runs: the usage account holds runs as the supervisor
writes them (closed just now), through the store itself."""

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from service.store import repository as repo
from service.store import usage
from service.store.db import make_engine, make_session_factory
from tests.conftest import LiveServer, _copy_sqlite, _start_server, _stop_server
from tests.dashboard.browser import CHROMIUM, SCREENSHOTS
from tests.security.people import new_token
from torchyard_contract.spec import JobSpec

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="browser tests need Debian's Chromium at /usr/bin/chromium (apt-get install chromium)",
)
TOKEN = "dashboard-teams-api-token-0123456789abcdef"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, _migrated_sqlite: Path) -> Iterator[tuple[LiveServer, str]]:
    home = tmp_path_factory.mktemp("teams-page") / "home"
    _copy_sqlite(_migrated_sqlite, home)
    srv = _start_server(home, {"TORCHYARD_API_TOKENS": TOKEN, "TORCHYARD_WARM_RANKS": "false",
                               "TORCHYARD_CPU_SLOTS": "2"})
    srv.token = TOKEN
    with srv.client() as admin:
        assert admin.post("/teams", json={"name": "vision", "quota": {
            "max_slots": 1, "slot_hours": 0.1}}).status_code == 201
        assert admin.post("/teams", json={"name": "nlp", "share": 2}).status_code == 201
        assert admin.post("/users", json={"name": "ann", "team": "vision"}).status_code == 201
        ann = new_token(admin, "ann")
    engine = make_engine(f"sqlite:///{home / 'torchyard.db'}")
    with make_session_factory(engine)() as session:  # half a slot-hour of ann's, just ended
        job = repo.create_job(session, JobSpec(dataset="synthetic"), owner="ann", team="vision")
        repo.transition(session, job.id, repo.JobState.cancelled, reason="for the page")
        now = time.time()
        usage.open_run(session, job.id, 1, now - 1800)
        usage.close_runs(session, job.id, now)
        session.commit()
    engine.dispose()
    yield srv, ann
    _stop_server(srv)


def _open(pg, server: LiveServer, token: str) -> None:  # type: ignore[no-untyped-def]
    pg.add_init_script(f"localStorage.setItem('torchyard.token', '{token}')")
    pg.goto(f"{server.url}/#/teams")


def test_the_teams_page_shows_usage_against_quota_and_budget_and_the_rank(
    server: tuple[LiveServer, str], watched,  # type: ignore[no-untyped-def]
) -> None:
    srv, _ = server
    pg, _ = watched
    _open(pg, srv, TOKEN)
    pg.locator("#team-table tr[data-team='vision']").wait_for()
    assert pg.locator("#slots-vision").inner_text() == "0 of 1 slots"
    budget = pg.locator("#budget-vision")
    assert budget.inner_text() == "0.5 of 0.1 slot-h"
    assert budget.locator(".meter-bar.over").count() == 1
    assert pg.locator("#spent-vision").inner_text().startswith(
        "team vision used 0.5 of 0.1 slot-hours this month; resets ")
    assert (pg.locator("#rank-nlp").inner_text(), pg.locator("#rank-vision").inner_text()) == (
        "1", "2"), "nlp has used nothing: it comes first"
    assert pg.locator("#budget-nlp").inner_text() == "0 slot-h, no budget"
    row = pg.locator("#usage-table tr[data-user='ann']")
    row.wait_for()
    assert row.inner_text().split("\t")[:3] == ["vision", "ann", "0.5"]
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    pg.screenshot(path=str(SCREENSHOTS / "teams.png"), full_page=True)


def test_a_member_sees_their_own_team_only(
    server: tuple[LiveServer, str], watched,  # type: ignore[no-untyped-def]
) -> None:
    srv, ann = server
    pg, _ = watched
    _open(pg, srv, ann)
    pg.locator("#team-table tr[data-team='vision']").wait_for()
    assert pg.locator("#team-table tbody tr").count() == 1
    assert pg.locator("#usage-table tr[data-user='ann']").count() == 1
