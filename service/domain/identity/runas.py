"""Which Unix user a job runs as: its team's ``unix_user``, when the server can switch to it.

:func:`resolve_run_as` turns a team's ``unix_user`` into the ``RunAs`` the launch carries
(``torchyard_contract.launch``), or None: the job then runs as the server's own user, as every job
did before teams had Unix users. Only a server running as root can start processes as another
user; any other server runs every job as itself (and says so: docs/security.md). A user that does
not exist, root, or the server's own user is refused with a message that names it — a job must
never run as root by way of a team, and "its own user" would isolate nothing.

What the run directory becomes for such a job is ``service.domain.files.runowner``'s.
"""

import pwd

from torchyard_contract.launch import RunAs


class RunAsRefused(ValueError):
    """A team's ``unix_user`` that no job may run as (the message names it and why)."""


def resolve_run_as(unix_user: str | None, server_uid: int) -> RunAs | None:
    """The user a job of a team with ``unix_user`` runs as, on a server running as
    ``server_uid``; None when the team has none or the server is not root (jobs then run as the
    server). Raises :class:`RunAsRefused` for a user this host does not know, root, or the
    server's own user — whether or not the server is root, so a mistake shows on any server."""
    if unix_user is None:
        return None
    try:
        entry = pwd.getpwnam(unix_user)
    except KeyError:
        raise RunAsRefused(
            f"unix_user: {unix_user!r} is not a user on this host (it must exist here and on "
            "every Slurm node)") from None
    if entry.pw_uid == 0:
        raise RunAsRefused(f"unix_user: {unix_user!r} is root; jobs never run as root")
    if entry.pw_uid == server_uid:
        raise RunAsRefused(
            f"unix_user: {unix_user!r} is the server's own user; it would isolate nothing")
    if server_uid != 0:
        return None
    return RunAs(user=entry.pw_name, uid=entry.pw_uid, gid=entry.pw_gid)
