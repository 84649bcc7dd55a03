"""Who a bearer token names: the ``Principal`` of a request, and the gate that says whether the
API is open (see ``service.api.middleware.auth`` for the contract).

A personal token is looked up by its SHA-256 (one indexed read with its user); a JWT is checked
by ``service.domain.identity.idtokens`` and its user read by name. ``SignIn.resolve`` runs on
the thread pool (it reads the database).
"""

import hmac
import logging
import math
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta
from enum import Enum

from sqlalchemy.orm import Session, sessionmaker

from service.domain.identity.accounts import TOKEN_PREFIX
from service.domain.identity.caller import ADMIN, Caller, Role
from service.domain.identity.idtokens import JwtRefused, JwtVerifier, looks_like_jwt
from service.settings.tokens import hash_token
from service.store import identity as store
from service.store import repository as repo
from service.store.clock import utcnow

logger = logging.getLogger(__name__)

TOUCH_EVERY = timedelta(seconds=60)  # a token's last_used_at is written at most this often
GATE_RECHECK_S = 1.0  # an open server looks for a first personal token at most this often


class Via(str, Enum):
    """How the caller signed in (the audit log records it)."""

    open = "open"  # no sign-in configured and no personal token made: everyone is admin
    bootstrap = "bootstrap"  # one of TORCHYARD_API_TOKENS / _FILE
    token = "token"  # a personal token (ty_…)
    jwt = "jwt"  # an identity provider's JWT
    job = "job"  # a job's own token (its ranks' records only)


@dataclass(frozen=True)
class Principal:
    via: Via
    caller: Caller | None = None  # None: a job token
    token_id: int | None = None
    job_id: int | None = None

    @property
    def user(self) -> str | None:
        return self.caller.user if self.caller else None

    def sees(self, team: str | None) -> bool:
        return self.caller is not None and self.caller.sees(team)


OPEN = Principal(Via.open, ADMIN)
NOBODY = Principal(Via.open)  # not signed in (a public path): no caller, may do nothing more
BOOTSTRAP = Principal(Via.bootstrap, ADMIN)


@dataclass(frozen=True)
class Refusal:
    status: int  # 401, or 403 for a job token off its route
    message: str


@dataclass(frozen=True)
class TokenSet:
    """SHA-256 digests of the bootstrap API tokens; empty means none are configured."""

    digests: frozenset[str]

    @property
    def enabled(self) -> bool:
        return bool(self.digests)

    def is_api_token(self, token: str) -> bool:
        digest = hash_token(token)
        found = False
        for known in self.digests:  # no early exit: time does not depend on which one matched
            found |= hmac.compare_digest(digest, known)
        return found


@dataclass
class SignIn:
    """Resolves tokens to principals; ``closed`` says whether callers need one at all."""

    tokens: TokenSet
    read_sessions: sessionmaker[Session]
    write_sessions: sessionmaker[Session]
    jwt: JwtVerifier | None = None
    _closed: bool = False
    _checked_at: float = -math.inf
    _touched: dict[int, float] = field(default_factory=dict)  # token id → monotonic time

    def __post_init__(self) -> None:
        self._closed = self.tokens.enabled or self.jwt is not None

    def close(self) -> None:
        """A personal token was made: callers need a token from now on."""
        self._closed = True

    def closed_known(self) -> bool | None:
        """True or False when known without reading the database; None when it must be read."""
        if self._closed:
            return True
        return None if time.monotonic() - self._checked_at >= GATE_RECHECK_S else False

    def check_closed(self) -> bool:
        """Read the database: has a personal token ever been made? (Thread pool.)"""
        with self.read_sessions() as session:
            found = store.any_token(session)
        self._checked_at = time.monotonic()
        if found:
            self._closed = True
        return self._closed

    def resolve(self, token: str) -> Principal | Refusal:
        """The principal of a token that is not a bootstrap one (checked first, in memory)."""
        if token.startswith(TOKEN_PREFIX):
            return self._personal(token)
        if self.jwt is not None and looks_like_jwt(token):
            try:
                user = self.jwt.user_of(token)
            except JwtRefused as exc:
                return Refusal(401, f"invalid token: {exc}")
            return self._user_principal(user)
        with self.read_sessions() as session:
            if repo.job_id_for_token_hash(session, hash_token(token)) is not None:
                return Refusal(403, "a job token may only post records for its own job")
        return Refusal(401, "invalid API token")

    def _personal(self, token: str) -> Principal | Refusal:
        with self.read_sessions() as session:
            owner = store.token_owner(session, hash_token(token))
        now = utcnow()
        if owner is None:
            return Refusal(401, "invalid API token")
        if owner.revoked_at is not None:
            return Refusal(401, f"token {owner.token_id} was revoked")
        if owner.expires_at is not None and owner.expires_at <= now:
            return Refusal(401, f"token {owner.token_id} expired at {owner.expires_at:%Y-%m-%dT%H:%MZ}")
        if owner.disabled:
            return Refusal(401, f"user {owner.user} is disabled")
        if owner.last_used_at is None or now - owner.last_used_at >= TOUCH_EVERY:
            self._touch(owner.token_id)
        return Principal(Via.token, Caller(owner.user, owner.team, Role(owner.role)),
                         token_id=owner.token_id)

    def _user_principal(self, name: str) -> Principal | Refusal:
        with self.read_sessions() as session:
            user = store.get_user(session, name)
        if user is None:
            return Refusal(401, f"invalid token: no torchyard user {name[:64]!r}")
        if user.disabled:
            return Refusal(401, f"user {user.name} is disabled")
        return Principal(Via.jwt, Caller(user.name, user.team, Role(user.role)))

    def _touch(self, token_id: int) -> None:
        """Write ``last_used_at`` off the request (a thread of its own: a busy database must
        not hold the caller up), at most once a minute per token in this process."""
        now = time.monotonic()
        if now - self._touched.get(token_id, -math.inf) < TOUCH_EVERY.total_seconds():
            return
        self._touched[token_id] = now

        def write() -> None:
            try:
                with self.write_sessions() as session:
                    store.touch_token(session, token_id, utcnow())
                    session.commit()
            except Exception as exc:  # best effort: the next minute tries again
                logger.warning("token %s: last_used_at not written: %s", token_id, exc)

        threading.Thread(target=write, name=f"touch-token-{token_id}", daemon=True).start()
