"""docs/architecture.md covers every folder of ``service/``: a folder added without a word in the
architecture document fails here, naming it."""

from tests.conftest import REPO_ROOT

DOC = REPO_ROOT / "docs" / "architecture.md"


def _folders() -> list[str]:
    service = REPO_ROOT / "service"
    found = [service] + [p for p in service.rglob("*") if p.is_dir() and p.name != "__pycache__"]
    # A folder counts when it holds code or the dashboard's files (not only caches).
    return sorted(
        f"{p.relative_to(REPO_ROOT).as_posix()}/" for p in found
        if any(c.is_file() and c.suffix in {".py", ".js", ".html", ".css"} for c in p.iterdir())
    )


def test_every_folder_of_service_is_in_the_architecture_document() -> None:
    text = DOC.read_text(encoding="utf-8")
    missing = [folder for folder in _folders() if f"`{folder}`" not in text]
    assert not missing, f"docs/architecture.md does not mention: {missing}"


def test_the_folder_list_is_not_empty() -> None:
    """The walk finds the folders it must (a moved REPO_ROOT would make the test above vacuous)."""
    folders = _folders()
    assert "service/domain/loop/" in folders and "service/dashboard/" in folders
