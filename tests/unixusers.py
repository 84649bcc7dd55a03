"""Unix users for the run-as tests (docs/security.md, "Run as the team's Unix user"): made with
``useradd --system --no-create-home`` when missing, removed by the fixture that made them.

Names carry the pytest-xdist worker (``ty-test-a-gw1``), so workers never share (or remove) each
other's users. Needs root (as CI runs): elsewhere the tests that use them are skipped, saying why
(failed under ``CI=true``).
"""

import grp
import json
import os
import pwd
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from service.executor.asuser import why_user_cannot_start
from torchyard_contract.childenv import environ_for_children
from torchyard_contract.launch import RunAs


def why_not() -> str | None:
    """Why Unix users cannot be made here (None: they can)."""
    if os.geteuid() != 0:
        return "run-as needs root (jobs of a team's Unix user are started by a root server)"
    if shutil.which("useradd") is None or shutil.which("userdel") is None:
        return "useradd/userdel not found (the passwd package)"
    return None


def _name(base: str) -> str:
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    return f"{base}-{worker}" if worker else base


def _run_as(name: str) -> RunAs:
    entry = pwd.getpwnam(name)
    return RunAs(user=name, uid=entry.pw_uid, gid=entry.pw_gid)


@contextmanager
def unix_users(*bases: str) -> Iterator[list[RunAs]]:
    """The users ``ty-test-<base>`` (made when missing: idempotent), as ``RunAs``; those made
    here are removed after."""
    made = []
    names = [_name(f"ty-test-{base}") for base in bases]
    try:
        for name in names:
            try:
                pwd.getpwnam(name)
            except KeyError:
                subprocess.run(["useradd", "--system", "--no-create-home", "--user-group",
                                "--shell", "/usr/sbin/nologin", name],
                               check=True, capture_output=True, timeout=60)
                made.append(name)
        yield [_run_as(name) for name in names]
    finally:
        for name in made:
            subprocess.run(["userdel", name], capture_output=True, timeout=60)
            try:  # --user-group made it; userdel removes it unless another user has it too
                grp.getgrnam(name)
                subprocess.run(["groupdel", name], capture_output=True, timeout=60)
            except KeyError:
                pass


def usable_by_others(path: Path) -> bool:
    """Whether a process of another user (not in root's group) could run ``path``."""
    real = path.resolve()
    if not real.stat().st_mode & 0o001:
        return False
    return all(parent.stat().st_mode & 0o001 for parent in real.parents)


def python_for_users(workdir: Path, user: RunAs) -> Path:
    """An interpreter the test users can run, with this one's packages: this one when they can
    (CI); else a venv made in ``workdir`` from the system's Python of the same version, seeing
    this environment's site-packages (a pyenv Python under a 0700 ``/root``). The test is
    skipped (failed under CI) when there is none, or when ``user`` still cannot import the
    attempt loop with it, for the reason the server itself would give
    (``asuser.why_user_cannot_start``: e.g. a checkout below a 0700 ``mktemp -d`` directory)."""
    python = _python_for_users(workdir)
    if python is None:
        skip_or_fail(f"no Python the test users can run ({sys.executable} is not theirs to "
                     "run, and no system Python of the same version)")
    why = why_user_cannot_start(str(python), user, environ_for_children(os.environ))
    if why is not None:
        skip_or_fail(f"the run-as tests need a checkout other users can read: {why}")
    return python


def _python_for_users(workdir: Path) -> Path | None:
    here = Path(sys.executable)
    if usable_by_others(here):
        return here
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    system = Path("/usr/bin") / version
    if not system.exists() or not usable_by_others(system):
        return None
    venv = workdir / "run-as-venv"
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([str(system), "-m", "venv", "--without-pip", str(venv)], check=True,
                       capture_output=True, timeout=120)
        site = venv / "lib" / version / "site-packages"
        import site as this_site

        # addsitedir, not a plain path line: it also reads the .pth files there (the editable
        # install's, which puts the checkout on the path).
        (site / "torchyard-test.pth").write_text("".join(
            f"import site; site.addsitedir({d!r})\n" for d in this_site.getsitepackages()))
    reachable(venv)
    return python


def reachable(path: Path) -> None:
    """Let other users pass through every directory above ``path`` (o+x), as a server's home
    must be for run-as jobs (pytest makes its temporary directories 0700)."""
    for parent in [path, *path.parents]:
        mode = parent.stat().st_mode
        if not mode & 0o001:
            parent.chmod((mode & 0o7777) | 0o011)


PROBE = """\
import json, os, sys
out = {}
for label, path in json.loads(sys.argv[1]).items():
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            out[label] = sorted(os.listdir(path))
        else:
            with open(path, "rb") as f:
                out[label] = f.read().decode(errors="replace")
    except OSError as exc:
        out[label] = f"{type(exc).__name__}: {exc.strerror}"
print(json.dumps(out))
"""


def read_as(user: RunAs, paths: dict[str, str], python: Path) -> dict[str, str | list[str]]:
    """What a process of ``user`` (its primary group, no other) reads at each path: the text,
    a directory's names, or ``"PermissionError: ..."`` and the like."""
    done = subprocess.run(
        [str(python), "-c", PROBE, json.dumps(paths)], user=user.uid, group=user.gid,
        extra_groups=[], cwd="/", capture_output=True, text=True, timeout=60, check=True)
    return json.loads(done.stdout)


def skip_or_fail(why: str) -> None:
    """Skip, saying why; under CI (``CI=true``) fail instead: CI has what these tests need."""
    if os.environ.get("CI") == "true":
        pytest.fail(why)
    pytest.skip(why)


@contextmanager
def users_or_skip(*bases: str) -> Iterator[list[RunAs]]:
    """:func:`unix_users`, or the test skipped (failed under CI) where they cannot be made."""
    if (why := why_not()) is not None:
        skip_or_fail(why)
    with unix_users(*bases) as users:
        yield users
