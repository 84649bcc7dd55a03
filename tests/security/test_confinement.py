"""The one path-confinement policy (``torchyard_contract.confinement``) and its users: script and
data directories (trusted roots: resolved, then inside), an archive's members, a job's artifacts
and the TensorBoard files a client downloads (untrusted trees: plain relative names only)."""

from pathlib import Path

import pytest

from service.client.tensorboard import _local_path
from service.domain.files.artifactnames import name_bytes
from service.domain.files.treewriter import ArchiveRefused, Limits, TreeWriter
from torchyard_contract.confinement import (
    PathRefused,
    confine,
    name_refusal,
    relative_parts,
    resolves_inside,
)


@pytest.fixture
def roots(tmp_path: Path) -> tuple[Path, Path]:
    inside, outside = tmp_path / "scripts", tmp_path / "elsewhere"
    inside.mkdir()
    outside.mkdir()
    (inside / "train.py").write_text("")
    (outside / "secret.py").write_text("")
    (inside / "escape.py").symlink_to(outside / "secret.py")
    (inside / "alias.py").symlink_to(inside / "train.py")
    return inside, outside


def test_a_trusted_root_holds_what_resolves_inside_it(roots: tuple[Path, Path]) -> None:
    inside, outside = roots
    assert confine("train.py", [inside], "entrypoint") == inside / "train.py"
    assert confine("alias.py", [inside], "entrypoint") == inside / "train.py"
    assert confine(str(inside / "sub" / ".." / "train.py"), [inside], "x") == inside / "train.py"
    for path in ("escape.py", "../elsewhere/secret.py", str(outside / "secret.py")):
        with pytest.raises(PathRefused, match="entrypoint: .* is outside the allowed directories"):
            confine(path, [inside], "entrypoint")
    with pytest.raises(PathRefused, match="must not contain NUL"):
        confine("train.py\x00", [inside], "entrypoint")
    with pytest.raises(PathRefused, match="no directories are configured"):
        confine("train.py", [], "dataset_root")
    assert resolves_inside(inside / "alias.py", [inside]) == inside / "train.py"
    assert resolves_inside(inside / "escape.py", [inside]) is None


@pytest.mark.parametrize(("path", "rule"), [
    ("/etc/passwd", "absolute paths are not allowed"),
    ("a/../../b", "'..' is not allowed in a name"),
    ("..", "'..' is not allowed in a name"),
    ("a\x00b", "must not contain NUL bytes"),
    ("", "an empty name"),
    ("./.", "an empty name"),
])
def test_an_untrusted_tree_takes_plain_relative_names_only(path: str, rule: str) -> None:
    with pytest.raises(PathRefused) as refused:
        relative_parts(path, "member")
    assert refused.value.rule == rule and str(refused.value) == f"member: {rule}"


def test_plain_names_are_kept_in_order() -> None:
    assert relative_parts("./a//b/./c.txt") == ("a", "b", "c.txt")
    assert [name_refusal(n) for n in ("x", "", ".", "..", "a/b", b"a\x00")] == [
        None, "an empty name", "an empty name", "'..' is not allowed in a name",
        "a name must not contain '/'", "must not contain NUL bytes"]


def test_every_user_of_untrusted_trees_refuses_the_same_names(tmp_path: Path) -> None:
    writer = TreeWriter(tmp_path / "dest", Limits(max_files=10, max_unpacked_bytes=1000),
                        compressed=lambda: 1000)
    for bad in ("/abs", "a/../../b", "a\x00b", "."):
        with pytest.raises(ArchiveRefused, match=relative_rule(bad)):
            writer.name(bad)
        assert _local_path(tmp_path, "tensorboard/" + bad) is None
    assert _local_path(tmp_path, "tensorboard/run/events.out") == tmp_path / "run" / "events.out"
    for listed in ("", ".", "..", "a%2Fb", "a%00"):
        assert name_bytes(listed) is None
    assert name_bytes("r%C3%A9sum%25") == "résum%".encode()


def relative_rule(path: str) -> str:
    try:
        relative_parts(path)
    except PathRefused as exc:
        return exc.rule.replace("'", ".").replace("(", r"\(")
    raise AssertionError(f"{path!r} was not refused")
