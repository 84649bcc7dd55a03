"""The docs cannot drift: generated tables match the models, every field is described, links resolve."""

import re
from pathlib import Path

import pytest

from service.settings import Settings
from tools import docgen

REPO = docgen.REPO_ROOT
# Pages another branch writes (issue 12); drop a name here once that page is merged.
# The front page is for a newcomer: what it is, set-up, a walkthrough, guarantees, links.
README_MAX_LINES = 150


@pytest.mark.parametrize("table", docgen.TABLES, ids=lambda t: t.name)
def test_generated_table_is_current(table: docgen.Table) -> None:
    text = table.doc.read_text()
    assert docgen.rewrite(text, table) == text, (
        f"{table.doc.relative_to(REPO)}: the {table.name} table differs from the model; "
        f"regenerate it with: {docgen.REGENERATE_COMMAND}"
    )


def test_check_mode_reports_a_stale_table(tmp_path: Path) -> None:
    table = docgen.TABLES[0]
    stale = tmp_path / "spec.md"
    stale.write_text(f"intro\n{table.start}\n| old | table |\n{table.end}\noutro\n")
    copy = docgen.Table(table.name, table.model, stale, table.render)
    assert docgen.stale_docs((copy,)) == [stale]
    stale.write_text(docgen.rewrite(stale.read_text(), copy))
    assert docgen.stale_docs((copy,)) == []
    assert stale.read_text().startswith("intro\n") and stale.read_text().endswith("\noutro\n")
    assert docgen.main(["--check"]) == 0


def test_every_setting_is_documented() -> None:
    assert docgen.undocumented_fields(Settings) == []


def test_every_spec_field_is_documented() -> None:
    assert docgen.undocumented_fields(docgen.JobSpec) == []


def _row(doc: Path, first_cell: str) -> str:
    rows = [ln for ln in doc.read_text().splitlines() if ln.startswith(f"| {first_cell} |")]
    assert len(rows) == 1, f"{first_cell} row in {doc}"
    return rows[0]


def test_tables_state_the_bounds_the_code_enforces() -> None:
    spec = REPO / "docs" / "spec.md"
    # The hand-written table once left out both upper bounds.
    assert "≤ 2,592,000" in _row(spec, "`max_runtime_s`")
    assert "≤ 86,400" in _row(spec, "`heartbeat_timeout_s`")
    assert "`600`" in _row(spec, "`heartbeat_timeout_s`")
    assert '`"nccl"`' in _row(spec, "`backend`")
    config = REPO / "docs" / "configuration.md"
    for name in Settings.model_fields:
        _row(config, f"`TORCHYARD_{name.upper()}`")
    # A default computed from the machine must not make the table machine-dependent.
    assert "| computed |" in _row(config, "`TORCHYARD_CPU_SLOTS`")


def _markdown_files() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces as hyphens."""
    headings = re.findall(r"^#+ (.+)$", page.read_text(), flags=re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


@pytest.mark.parametrize("page", _markdown_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(page: Path) -> None:
    missing = []
    for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
        if re.match(r"[a-z]+:", target):
            continue
        file_part, _, anchor = target.partition("#")
        path = (page.parent / file_part).resolve() if file_part else page
        if not path.exists() or anchor and anchor not in _anchors(path):
            missing.append(target)
    assert missing == [], f"{page.relative_to(REPO)} links to missing files or headings"


def test_every_docs_page_is_in_the_index() -> None:
    index = (REPO / "docs" / "README.md").read_text()
    pages = {p.name for p in (REPO / "docs").glob("*.md")} - {"README.md"}
    assert {p for p in pages if f"]({p})" not in index} == set()


def test_readme_fits_on_a_screen_and_keeps_the_set_up_commands() -> None:
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= README_MAX_LINES
    assert "pip install -e . -c constraints.txt && torchyard serve" in text
    assert "pip install -e '.[test]' -c constraints.txt && python -m pytest" in text
    assert '-m "not slow"' in text
