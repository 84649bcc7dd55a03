"""What the identity tests share: a cast of teams, users and personal tokens made through the API
itself, on a server in a thread (``tests.fixtures.threadserver``)."""

from dataclasses import dataclass

import httpx
from fastapi import FastAPI

from tests.fixtures.threadserver import ThreadServer, serve_in_thread  # noqa: F401 (re-export)

BOOTSTRAP = "bootstrap-token-for-identity-tests-0123"




@dataclass(frozen=True)
class Cast:
    """Tokens by role: an admin user, a member and a viewer of team ``a``, a member of ``b``."""

    admin: str
    member: str  # alice, team a
    viewer: str  # vic, team a
    other: str  # bob, member of team b

    def token(self, who: str) -> str | None:
        if who == "none":
            return None
        return BOOTSTRAP if who == "bootstrap" else getattr(self, who)


def make_cast(client: httpx.Client) -> Cast:
    """Teams a and b, their users and a token each, made with the bootstrap token ``client``
    sends."""
    for team in ("a", "b"):
        assert client.post("/teams", json={"name": team}).status_code == 201
    users = {"root2": (None, "admin"), "alice": ("a", "member"), "vic": ("a", "viewer"),
             "bob": ("b", "member")}
    for name, (team, role) in users.items():
        r = client.post("/users", json={"name": name, "team": team, "role": role})
        assert r.status_code == 201, r.text
    tokens = {name: new_token(client, name) for name in users}
    return Cast(admin=tokens["root2"], member=tokens["alice"], viewer=tokens["vic"],
                other=tokens["bob"])


def new_token(client: httpx.Client, user: str, days: int = 30) -> str:
    r = client.post(f"/users/{user}/tokens", json={"name": "test", "expires_in_days": days})
    assert r.status_code == 201, r.text
    return r.json()["token"]


def operations(app: FastAPI) -> list[tuple[str, str]]:
    """(method, path template) of every route of the app, as it is now (HEAD is its GET's)."""
    import fastapi.routing
    from starlette.routing import Mount, Route

    flatten = getattr(fastapi.routing, "iter_route_contexts", None)
    ops: set[tuple[str, str]] = set()
    for item in flatten(app.routes) if flatten else app.routes:
        original = getattr(item, "original_route", item)
        if isinstance(original, Mount):
            ops.add(("GET", item.path.rstrip("/") + "/{path:path}"))
        elif isinstance(original, Route):
            ops.update((m, item.path) for m in (item.methods or {"GET"}) if m != "HEAD")
    return sorted(ops)
