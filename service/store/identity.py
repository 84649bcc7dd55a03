"""SQL of teams, users, personal tokens and package grants (``service.domain.identity`` decides;
this only reads and writes). Names are the keys the rest of the store uses (``jobs.team``,
``jobs.owner``): a team or user is never renamed or deleted."""

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import delete, exists, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from service.store.clock import utcnow
from service.store.tables import ApiToken, PackageGrant, Team, User

# --- teams -----------------------------------------------------------------------------------

def create_team(session: Session, name: str, **fields: object) -> Team | None:
    """A new team; None when the name is taken."""
    team = Team(name=name, created_at=utcnow(), **fields)
    try:
        with session.begin_nested():
            session.add(team)
    except IntegrityError:
        return None
    return team


def get_team(session: Session, name: str) -> Team | None:
    return session.scalar(select(Team).where(Team.name == name))


def list_teams(session: Session) -> Sequence[Team]:
    return session.scalars(select(Team).order_by(Team.name)).all()


def update_team(session: Session, name: str, fields: dict[str, object]) -> None:
    if fields:
        session.execute(update(Team).where(Team.name == name).values(**fields))


# --- users -----------------------------------------------------------------------------------

def create_user(session: Session, name: str, team: str | None, role: str) -> User | None:
    """A new user; None when the name is taken."""
    user = User(name=name, team=team, role=role, disabled=False, created_at=utcnow())
    try:
        with session.begin_nested():
            session.add(user)
    except IntegrityError:
        return None
    return user


def get_user(session: Session, name: str) -> User | None:
    return session.scalar(select(User).where(User.name == name))


def list_users(session: Session, team: str | None = None) -> Sequence[User]:
    q = select(User).order_by(User.name)
    if team is not None:
        q = q.where(User.team == team)
    return session.scalars(q).all()


def update_user(session: Session, name: str, fields: dict[str, object]) -> None:
    if fields:
        session.execute(update(User).where(User.name == name).values(**fields))


# --- personal tokens ---------------------------------------------------------------------------

@dataclass(frozen=True)
class TokenOwner:
    """A token as the auth check needs it, with its user (one indexed lookup by hash)."""

    token_id: int
    expires_at: datetime | None
    revoked_at: datetime | None
    last_used_at: datetime | None
    user: str
    team: str | None
    role: str
    disabled: bool


def add_token(
    session: Session, user_id: int, name: str, token_hash: str, expires_at: datetime | None
) -> ApiToken:
    token = ApiToken(user_id=user_id, name=name, token_hash=token_hash, created_at=utcnow(),
                     expires_at=expires_at)
    session.add(token)
    session.flush()
    return token


def token_owner(session: Session, token_hash: str) -> TokenOwner | None:
    """The token whose SHA-256 is ``token_hash`` (a digest: equality is safe) and its user."""
    row = session.execute(
        select(ApiToken.id, ApiToken.expires_at, ApiToken.revoked_at, ApiToken.last_used_at,
               User.name, User.team, User.role, User.disabled)
        .join(User, User.id == ApiToken.user_id)
        .where(ApiToken.token_hash == token_hash)
    ).first()
    return TokenOwner(*row) if row is not None else None


def any_token(session: Session) -> bool:
    """Whether a personal token was ever made (revoked ones count): the server is then closed
    to callers without one (``service.api.middleware.auth``)."""
    return bool(session.scalar(select(exists().where(ApiToken.id.is_not(None)))))


def tokens_of(session: Session, user_id: int) -> Sequence[ApiToken]:
    return session.scalars(
        select(ApiToken).where(ApiToken.user_id == user_id).order_by(ApiToken.id)
    ).all()


def get_token(session: Session, token_id: int) -> tuple[ApiToken, str] | None:
    """The token and its user's name."""
    row = session.execute(
        select(ApiToken, User.name).join(User, User.id == ApiToken.user_id)
        .where(ApiToken.id == token_id)
    ).first()
    return (row[0], row[1]) if row is not None else None


def revoke_token(session: Session, token_id: int) -> None:
    session.execute(update(ApiToken).where(ApiToken.id == token_id, ApiToken.revoked_at.is_(None))
                    .values(revoked_at=utcnow()))


def touch_token(session: Session, token_id: int, at: datetime) -> None:
    session.execute(update(ApiToken).where(ApiToken.id == token_id).values(last_used_at=at))


# --- package grants --------------------------------------------------------------------------

def grant_package(session: Session, digest: str, team: str) -> bool:
    """``team`` may use ``digest`` from now on; True when it could not before."""
    if session.get(PackageGrant, (digest, team)) is not None:
        return False
    try:
        with session.begin_nested():
            session.add(PackageGrant(digest=digest, team=team, granted_at=utcnow()))
    except IntegrityError:  # the same team uploading it twice at once
        return False
    return True


def package_granted(session: Session, digest: str, team: str) -> bool:
    return session.get(PackageGrant, (digest, team)) is not None


def drop_package_grants(session: Session, digests: Sequence[str]) -> None:
    """The grants of packages collected from the store (``Cleanup.sweep``)."""
    if digests:
        session.execute(delete(PackageGrant).where(PackageGrant.digest.in_(digests)))
