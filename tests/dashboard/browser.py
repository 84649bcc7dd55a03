"""What the browser tests share (tests/dashboard/, tests/api/test_apidocs.py,
tests/lifecycle/test_stacks.py): Debian's Chromium, how it is started, where screenshots go, and
how a test reads the chart's traces. The ``browser`` and ``page`` fixtures are in
``tests/dashboard/conftest.py``.

Chromium comes from Debian (``apt-get install chromium``, done by ``.ci/run``), never from
``playwright install``; without ``/usr/bin/chromium`` the browser tests are skipped, saying why.
"""

import os
from pathlib import Path

from tests.conftest import REPO_ROOT

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--no-first-run", "--disable-sync",
]
# Screenshots of every page: CI keeps $TORCHYARD_TEST_ARTIFACTS (gitignored test-output/ here).
SCREENSHOTS = Path(os.environ.get("TORCHYARD_TEST_ARTIFACTS") or REPO_ROOT / "test-output") / "dashboard"
UI_TIMEOUT_MS = 60_000

# The chart element is plotly's graph div: gd.data holds the traces, each tagged with meta.
TRACES_JS = """() => (document.getElementById('chart')?.data || []).map(
    t => ({name: t.name, kind: t.meta.kind, rank: t.meta.rank ?? null, n: t.x.length}))"""


def chart_traces(pg) -> list[dict]:  # type: ignore[no-untyped-def]
    """The chart's traces: name, kind (rank, mean, …), rank and number of points."""
    return pg.evaluate(TRACES_JS)
