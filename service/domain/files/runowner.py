"""A job's run directory made ready for the user its processes run as.

:func:`prepare_run_dir` is the launch's first step: the directory created in the server's runs
directory and, for a job that runs as its team's Unix user (``RunAs``), handed to that user
(``torchyard_contract.runwrite.hand_over``: owner, mode 0700) before anything else is written in
it, so every file and directory the server then writes there (confined:
``torchyard_contract.runwrite``) is the user's too. A relaunch (a resumed or requeued job) keeps
the owner its run directory has: one launched as another user — before its team had a Unix
user, or under another one — is refused rather than given over, since its files would stay
the old owner's (a job as root in a directory a team's user can change, or a user's job that
cannot write its own logs).

``RunAs.cannot_enter`` (``torchyard_contract.launch``) says why the user could not enter the runs directory (a
directory on the way it may not search), so the launch fails with that reason rather than the
attempt loop's ``Permission denied``.
"""

import os

from torchyard_contract import runwrite
from torchyard_contract.launch import RunAs
from torchyard_contract.rundir import RunDir


def prepare_run_dir(run: RunDir, run_as: RunAs | None) -> None:
    """Create (or reuse) ``run``'s directory for a launch whose processes run as ``run_as``
    (None: this server's user) and clear the last launch's outcome (``RunDir.prepare``).
    Raises ``PermissionError`` (the message says why) when the directory is another user's or
    ``run_as`` cannot reach it."""
    existed = run.root.exists()
    run.root.mkdir(parents=True, exist_ok=True)
    owner = run.root.lstat().st_uid
    wanted = run_as.uid if run_as is not None else os.geteuid()
    if existed and owner != wanted:
        who = f"user {run_as.user} (uid {run_as.uid})" if run_as else f"uid {wanted}"
        raise PermissionError(
            f"its run directory {run.root} belongs to uid {owner}, and this launch runs as {who}:"
            " the team's Unix user changed since the job was first launched; submit it again")
    if run_as is not None:
        if (why := run_as.cannot_enter(run.root.parent)) is not None:
            raise PermissionError(why)
        runwrite.hand_over(run.root, run_as.uid, run_as.gid)
    run.prepare()
