"""constraints.txt (the tested set) must agree with pyproject.toml (what the code supports).

A dependency added to pyproject.toml without regenerating the lock (``bash .ci/lock``) would be
installed at whatever version is newest on the day: this fails first.
"""

import re
import tomllib

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.conftest import REPO_ROOT

PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)")


def declared() -> list[tuple[str, Requirement]]:
    """Every requirement of pyproject.toml: runtime ones and those of each extra."""
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    found = [("dependencies", Requirement(r)) for r in project["dependencies"]]
    for extra, reqs in project.get("optional-dependencies", {}).items():
        found += [(f"extra '{extra}'", Requirement(r)) for r in reqs]
    return found


def pinned() -> dict[str, Version]:
    pins: dict[str, Version] = {}
    for line in (REPO_ROOT / "constraints.txt").read_text().splitlines():
        match = PIN.match(line)
        if match:
            pins[canonicalize_name(match[1])] = Version(match[2])
    return pins


def test_every_declared_dependency_is_pinned_within_its_range() -> None:
    pins = pinned()
    problems = []
    for where, req in declared():
        name = canonicalize_name(req.name)
        if name == "torchyard":  # an extra that names the project's own other extras
            continue
        if name not in pins:
            problems.append(f"{req.name} ({where}) is not in constraints.txt")
        elif not req.specifier.contains(pins[name], prereleases=True):
            problems.append(f"{req.name}=={pins[name]} does not satisfy '{req}' ({where})")
    assert not problems, "\n".join(problems) + "\nregenerate with: bash .ci/lock"


def test_the_lock_names_no_direct_dependency_pyproject_dropped() -> None:
    """pip-compile marks direct dependencies 'via torchyard (pyproject.toml)'."""
    text = (REPO_ROOT / "constraints.txt").read_text()
    direct = set()
    for block in re.split(r"\n(?=[A-Za-z0-9])", text):
        match = PIN.match(block)
        if match and "torchyard (pyproject.toml)" in block:
            direct.add(canonicalize_name(match[1]))
    names = {canonicalize_name(req.name) for _, req in declared()}
    stale = sorted(direct - names)
    assert not stale, f"pinned as direct but not in pyproject.toml: {stale}; run bash .ci/lock"


def test_the_lock_says_how_to_regenerate_it() -> None:
    head = (REPO_ROOT / "constraints.txt").read_text()[:400]
    assert "bash .ci/lock" in head
