"""Teams, users and personal tokens: made, changed, listed and revoked (the admin routes and a
user's own tokens). Nothing is ever deleted: a user is disabled, a token revoked.

Contract: every method returns the stored row(s) or raises :class:`AccountRefused` with the
status (404, 409 or 422) and the field it names. A personal token is ``ty_`` and 43 random
URL-safe characters (256 bits; the prefix lets secret scanners find a leaked one); only its
SHA-256 is stored, and it is returned once, by :meth:`Accounts.create_token`.
"""

import os
import pwd
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy.orm import Session, sessionmaker

from service.domain.identity.caller import Role
from service.domain.identity.runas import RunAsRefused, resolve_run_as
from service.settings.tokens import hash_token
from service.store import identity as store
from service.store.clock import utcnow
from service.store.tables import ApiToken, Team, User

TOKEN_PREFIX = "ty_"


class AccountRefused(Exception):
    """A request about teams, users or tokens that cannot be done (``field`` names why)."""

    def __init__(self, status: int, kind: str, field: str | None, message: str) -> None:
        super().__init__(f"{field}: {message}" if field else message)
        self.status, self.kind, self.field = status, kind, field


def new_personal_token() -> tuple[str, str]:
    """(token, its SHA-256 hex digest)."""
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    return token, hash_token(token)


def check_unix_user(name: str) -> None:
    """A team's ``unix_user`` must exist on this host and be neither root nor the server's own
    user (its jobs would then run with the server's, or every, privilege): the one rule of
    ``service.domain.identity.runas``, answered as a 422 naming ``unix_user``."""
    try:
        resolve_run_as(name, os.geteuid())
    except RunAsRefused as exc:
        raise AccountRefused(422, "invalid_request", "unix_user",
                             str(exc).removeprefix("unix_user: ")) from None


def check_configured_unix_users(sessions: sessionmaker[Session]) -> None:
    """At start: raise ``ValueError`` naming every team whose ``unix_user`` is not a user of
    this host (any more): its jobs could not run as it, and must not run as the server."""
    with sessions() as session:
        teams = store.list_teams(session)
    missing = []
    for team in teams:
        if team.unix_user is None:
            continue
        try:
            pwd.getpwnam(team.unix_user)
        except KeyError:
            missing.append(f"team {team.name}: unix_user {team.unix_user!r}")
    if missing:
        raise ValueError("no such user on this host: " + "; ".join(missing) + " (create the "
                         "users, or clear them with PATCH /teams/{name} on a server that has them)")


def isolation(team: Team) -> str:
    """What keeps this team's jobs apart from other teams' on this host, said plainly."""
    server_user = pwd.getpwuid(os.geteuid()).pw_name
    if team.unix_user is None:
        return (f"no unix_user: this team's jobs run as the server's Unix user ({server_user}), "
                "like every other team's without one; API roles then keep other teams from "
                "reading its jobs through the API, but do not isolate its files or processes "
                "(run directory, outputs, /proc/<pid>/environ) from other teams' jobs")
    if os.geteuid() != 0:
        return (f"unix_user {team.unix_user} is set, but the server runs as {server_user}, not "
                "root, so jobs run as the server's user: API roles do not isolate this team's "
                "files or processes from other teams' jobs")
    return (f"jobs run as Unix user {team.unix_user}: their run directory, outputs and "
            "processes are closed to other teams' jobs that run as other users")


@dataclass
class Accounts:
    sessions: sessionmaker[Session]
    token_made: Callable[[], None]  # the API is closed from now on (service.api.middleware.auth)

    # --- teams --------------------------------------------------------------------------------
    def create_team(self, name: str, fields: dict[str, object]) -> Team:
        self._check_team_fields(fields)
        with self.sessions() as session:
            team = store.create_team(session, name, **fields)
            if team is None:
                raise AccountRefused(409, "conflict", "name", f"team {name!r} exists already")
            session.commit()
            session.refresh(team)
        return team

    def update_team(self, name: str, fields: dict[str, object]) -> Team:
        """Change the fields given; ``quota`` merges as a JSON merge patch (RFC 7396): its
        fields given change, ``null`` clears one, and ``"quota": null`` clears them all."""
        self._check_team_fields(fields)
        with self.sessions() as session:
            team = self._team(session, name)
            quota = fields.get("quota")
            if isinstance(quota, dict):
                fields = {**fields, "quota": {**(team.quota or {}), **quota}}
            store.update_team(session, name, fields)
            session.commit()
            return self._team(session, name)

    def team(self, name: str) -> Team:
        with self.sessions() as session:
            return self._team(session, name)

    def teams(self) -> list[Team]:
        with self.sessions() as session:
            return list(store.list_teams(session))

    @staticmethod
    def _check_team_fields(fields: dict[str, object]) -> None:
        unix_user = fields.get("unix_user")
        if isinstance(unix_user, str):
            check_unix_user(unix_user)

    @staticmethod
    def _team(session: Session, name: str) -> Team:
        team = store.get_team(session, name)
        if team is None:
            raise AccountRefused(404, "not_found", None, f"team {name!r} not found")
        return team

    # --- users --------------------------------------------------------------------------------
    def create_user(self, name: str, team: str | None, role: Role) -> User:
        with self.sessions() as session:
            self._check_membership(session, team, role)
            user = store.create_user(session, name, team, role.value)
            if user is None:
                raise AccountRefused(409, "conflict", "name", f"user {name!r} exists already")
            session.commit()
            session.refresh(user)
        return user

    def update_user(self, name: str, fields: dict[str, object]) -> User:
        with self.sessions() as session:
            user = self._user(session, name)
            team = fields.get("team", user.team)
            role = Role(fields.get("role", user.role))
            self._check_membership(session, team, role)  # type: ignore[arg-type]
            fields = {k: v.value if isinstance(v, Role) else v for k, v in fields.items()}
            store.update_user(session, name, fields)
            session.commit()
            return self._user(session, name)

    def user(self, name: str) -> User:
        with self.sessions() as session:
            return self._user(session, name)

    def users(self) -> list[User]:
        with self.sessions() as session:
            return list(store.list_users(session))

    @staticmethod
    def _check_membership(session: Session, team: str | None, role: Role) -> None:
        if team is None and role is not Role.admin:
            raise AccountRefused(422, "invalid_request", "team",
                                 f"a {role.value} belongs to a team; name one")
        if team is not None and store.get_team(session, team) is None:
            raise AccountRefused(422, "invalid_request", "team",
                                 f"no team {team!r} (create it with POST /teams)")

    @staticmethod
    def _user(session: Session, name: str) -> User:
        user = store.get_user(session, name)
        if user is None:
            raise AccountRefused(404, "not_found", None, f"user {name!r} not found")
        return user

    # --- tokens -------------------------------------------------------------------------------
    def create_token(self, user_name: str, name: str, expires_in_days: int) -> tuple[ApiToken, str]:
        """The stored token and the token itself (shown once, never stored)."""
        token, digest = new_personal_token()
        with self.sessions() as session:
            user = self._user(session, user_name)
            row = store.add_token(session, user.id, name, digest,
                                  utcnow() + timedelta(days=expires_in_days))
            session.commit()
            session.refresh(row)
        self.token_made()
        return row, token

    def tokens(self, user_name: str) -> list[ApiToken]:
        with self.sessions() as session:
            return list(store.tokens_of(session, self._user(session, user_name).id))

    def token_user(self, token_id: int) -> str | None:
        """The name of the user a token belongs to; None when there is no such token."""
        with self.sessions() as session:
            found = store.get_token(session, token_id)
        return found[1] if found is not None else None

    def revoke_token(self, token_id: int) -> ApiToken:
        """Revoked at once: the next request with it is a 401. Revoking twice changes nothing."""
        with self.sessions() as session:
            store.revoke_token(session, token_id)
            session.commit()
            found = store.get_token(session, token_id)
        if found is None:
            raise AccountRefused(404, "not_found", None, f"token {token_id} not found")
        return found[0]
