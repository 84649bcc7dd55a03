"""Who is asking, as the domain sees it (the request path builds one from its ``Principal``).

A caller sees a team's jobs, sweeps, secrets and packages when they are an admin or that
team's member or viewer; rows without a team (made before teams existed, or by an admin
without one) are seen by admins only.
"""

from dataclasses import dataclass
from enum import Enum


class Role(str, Enum):
    """What a user may do (docs/security.md, "Users, teams and roles")."""

    admin = "admin"  # everything, including users, teams and tokens
    member = "member"  # submit as their team; read and control their team's jobs and sweeps
    viewer = "viewer"  # read their team's jobs and sweeps

    @property
    def rank(self) -> int:
        return {Role.viewer: 0, Role.member: 1, Role.admin: 2}[self]

    def at_least(self, other: "Role") -> bool:
        return self.rank >= other.rank


# Who the bootstrap tokens (TORCHYARD_API_TOKENS) and an open server act as.
BOOTSTRAP_USER = "admin"


@dataclass(frozen=True)
class Caller:
    user: str
    team: str | None
    role: Role

    @property
    def admin(self) -> bool:
        return self.role is Role.admin

    def sees(self, team: str | None) -> bool:
        """May this caller see what belongs to ``team`` (None: to no team)?"""
        return self.admin or (team is not None and team == self.team)


ADMIN = Caller(BOOTSTRAP_USER, None, Role.admin)


def acting_for(owner: str | None, team: str | None) -> Caller:
    """Who a sweep's trials are made as: its owner, in its team, with a member's reach (a sweep
    of no team, made by an admin or before teams existed, with an admin's)."""
    if team is None:
        return Caller(owner or BOOTSTRAP_USER, None, Role.admin)
    return Caller(owner or BOOTSTRAP_USER, team, Role.member)
