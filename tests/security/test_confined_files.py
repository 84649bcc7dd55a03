"""The server's reads and writes in a run directory that belongs to a job's own Unix user
(``torchyard_contract.safefile``, ``torchyard_contract.runwrite``; docs/security.md, "Run as the
team's Unix user"): as root, in a directory of uid 65534 standing for that user, whatever the
user planted — a symlinked directory on the way, a symlink or hard link as the file itself, a
FIFO — is never read or written through, and what the server writes there is the user's."""

import os
import stat
import threading
from pathlib import Path

import pytest

from service.domain.files.artifactlisting import list_artifacts
from service.domain.files.artifacts import ArtifactNotFound, job_uid, open_artifact
from service.domain.files.runowner import prepare_run_dir
from tests.unixusers import reachable
from torchyard_contract import runwrite
from torchyard_contract.launch import RunAs
from torchyard_contract.rundir import RunDir
from torchyard_contract.safefile import is_regular, open_regular, read_bytes, read_tail

NOBODY = 65534
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act for another uid")


def _as_nobody(*paths: Path) -> None:
    for path in paths:
        os.chown(path, NOBODY, NOBODY, follow_symlinks=False)


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    """A file only root may read, in a directory only root may enter."""
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    path = private / "secret.txt"
    path.write_text("root's own")
    path.chmod(0o600)
    return path


@pytest.fixture
def run(tmp_path: Path) -> RunDir:
    """A run directory handed to the job's user (uid 65534), with its outputs."""
    run = RunDir(tmp_path / "runs" / "7")
    run.root.mkdir(parents=True)
    runwrite.hand_over(run.root, NOBODY, NOBODY)
    runwrite.make_dir(run.output_dir)
    return run


def test_a_symlinked_directory_a_job_planted_is_not_followed(run: RunDir, secret: Path) -> None:
    # The job replaces its spool directory by a link to root's directory.
    os.symlink(secret.parent, run.spool_dir)
    _as_nobody(run.spool_dir)
    planted = run.spool_dir / "secret.txt"
    assert planted.read_text() == "root's own"  # a plain open follows it ...
    assert read_bytes(planted, 100) is None  # ... the confined read does not
    assert read_tail(planted) == "" and open_regular(planted) is None and not is_regular(planted)
    assert read_bytes(secret, 100) == b"root's own"  # the file itself is readable as ever


def test_a_symlink_in_a_trusted_directory_is_followed(tmp_path: Path) -> None:
    """The host's own links (a home on another disk, /var/run) keep working: a link in a
    directory only root (or this user) can change was put there by one of them."""
    real = tmp_path / "disk" / "home"
    real.mkdir(parents=True)
    (real / "log.txt").write_text("host layout")
    (tmp_path / "home").symlink_to(real)
    assert read_bytes(tmp_path / "home" / "log.txt", 100) == b"host layout"
    assert read_bytes(tmp_path / "home", 100) is None  # the last component: never followed


def test_a_file_that_is_not_the_users_own_is_refused(run: RunDir, secret: Path) -> None:
    mine = run.output_dir / "result.txt"
    mine.write_text("the job's")
    _as_nobody(mine)
    # A hard link to root's file (what a job can make where fs.protected_hardlinks is 0)...
    os.link(secret, run.output_dir / "hardlink.txt")
    # ... and a file left there by someone else: neither is the directory owner's.
    (run.output_dir / "roots.txt").write_text("not the job's")
    assert read_bytes(mine, 100) == b"the job's"
    for name in ("hardlink.txt", "roots.txt"):
        assert read_bytes(run.output_dir / name, 100) is None
        with pytest.raises(ArtifactNotFound):
            open_artifact(run, name, job_uid(run))
    assert job_uid(run) == NOBODY  # the run directory was handed to the job's user
    page = list_artifacts(run, None, 10, job_uid(run))
    assert [a.path for a in page.items] == ["result.txt"] and page.skipped == 2


def test_writes_replace_a_planted_link_and_belong_to_the_user(run: RunDir, secret: Path) -> None:
    os.symlink(secret, run.pause_request)  # the job's trap for the server's next pause
    _as_nobody(run.pause_request)
    runwrite.write_file(run.pause_request, b'{"requested_at": 1}')
    assert secret.read_text() == "root's own", "the server wrote through the job's link"
    st = run.pause_request.lstat()
    assert stat.S_ISREG(st.st_mode) and (st.st_uid, st.st_gid) == (NOBODY, NOBODY)
    runwrite.make_dir(run.stacks_dir / "requests")
    for path in (run.stacks_dir, run.stacks_dir / "requests"):
        assert path.lstat().st_uid == NOBODY
    # A directory the job swapped for a link: nothing is created through it.
    os.symlink(secret.parent, run.root / "attempts")
    _as_nobody(run.root / "attempts")
    with pytest.raises(FileNotFoundError):
        runwrite.write_file(run.root / "attempts" / "1.json", b"{}")
    with pytest.raises(FileNotFoundError):
        runwrite.make_dir(run.root / "attempts" / "sub")
    assert sorted(os.listdir(secret.parent)) == ["secret.txt"]
    runwrite.remove(run.root / "attempts")  # the link, not what it points at
    assert secret.exists() and not (run.root / "attempts").exists()


def test_a_log_is_appended_only_if_it_is_the_users_plain_file(run: RunDir, secret: Path) -> None:
    log = run.root / "attempt-loop.log"
    os.symlink(secret, log)
    with pytest.raises(OSError):
        runwrite.open_append(log)
    os.unlink(log)
    os.link(secret, log)  # a hard link to root's file
    with pytest.raises(PermissionError):
        runwrite.open_append(log)
    os.unlink(log)
    os.mkfifo(log)  # would block an open for writing forever
    _as_nobody(log)
    opened = threading.Event()

    def attempt() -> None:
        try:
            os.close(runwrite.open_append(log))
        except OSError:
            pass
        opened.set()

    threading.Thread(target=attempt, daemon=True).start()
    assert opened.wait(10), "the server blocked on the job's FIFO"
    os.unlink(log)
    fd = runwrite.open_append(log)
    os.write(fd, b"started\n")
    os.close(fd)
    assert log.read_text() == "started\n" and log.stat().st_uid == NOBODY
    assert secret.read_text() == "root's own"


def test_a_package_copy_is_the_users_and_never_lands_through_a_link(
    run: RunDir, secret: Path, tmp_path: Path,
) -> None:
    tree = tmp_path / "package"
    (tree / "pkg").mkdir(parents=True)
    (tree / "pkg" / "train.py").write_text("print('hi')\n")
    (tree / "run.sh").write_text("#!/bin/sh\n")
    (tree / "run.sh").chmod(0o755)
    (tree / "link").symlink_to("pkg/train.py")
    os.symlink(secret.parent, run.work_dir)  # the job's link where its copy goes
    _as_nobody(run.work_dir)
    runwrite.replace_tree(tree, run.work_dir)
    assert sorted(os.listdir(secret.parent)) == ["secret.txt"]
    assert not run.work_dir.is_symlink()
    assert (run.work_dir / "pkg" / "train.py").read_text() == "print('hi')\n"
    assert os.readlink(run.work_dir / "link") == "pkg/train.py"
    assert (run.work_dir / "run.sh").stat().st_mode & 0o777 == 0o755
    for path in (run.work_dir, run.work_dir / "pkg", run.work_dir / "pkg" / "train.py",
                 run.work_dir / "run.sh", run.work_dir / "link"):
        assert path.lstat().st_uid == NOBODY, path


def test_a_run_directory_changes_hands_only_when_new(tmp_path: Path) -> None:
    """A relaunch as another user than the run directory's is refused (its files would stay
    the old owner's); a first launch hands it over, mode 0700."""
    someone = RunAs(user="nobody", uid=NOBODY, gid=NOBODY)
    reachable(tmp_path)
    run = RunDir(tmp_path / "runs" / "1")
    prepare_run_dir(run, someone)
    assert (run.root.stat().st_uid, run.root.stat().st_mode & 0o777) == (NOBODY, 0o700)
    assert run.logs_dir.stat().st_uid == NOBODY
    prepare_run_dir(run, someone)  # a resumed job of the same user
    with pytest.raises(PermissionError, match="belongs to uid 65534"):
        prepare_run_dir(run, None)  # now as the server itself: a job as root in its directory
    ours = RunDir(tmp_path / "runs" / "2")
    prepare_run_dir(ours, None)
    with pytest.raises(PermissionError, match="belongs to uid 0"):
        prepare_run_dir(ours, someone)
