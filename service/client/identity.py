"""Who is who, from the command line: ``torchyard team add|list``, ``user add|list|disable``,
``token create|list|revoke``, ``whoami`` and ``audit`` (docs/security.md, "Users, teams and
roles"). HTTP only, through ``TorchyardClient.request``; the options and exit codes are
``service.client.options``'."""

from typing import Annotated

import typer
from rich.table import Table

from service.client.options import (
    DEFAULT_URL,
    TokenOpt,
    UrlOpt,
    connect,
    console,
    err_console,
)
from service.client.usage import standing_rows, usage

team_app = typer.Typer(help="Teams: what jobs, sweeps, secrets and packages belong to; their "
                       "quotas, budgets and fair share.")
user_app = typer.Typer(help="Users (admin): people and pipelines, each a role in a team.")
token_app = typer.Typer(help="Personal API tokens (your own; an admin: anyone's).")
Name = Annotated[str, typer.Argument(help="lower-case letters, digits, '.', '_', '-'")]


def _table(columns: list[str], rows: list[dict]) -> Table:
    table = Table(*columns)
    for row in rows:
        table.add_row(*("-" if row.get(c) is None else str(row.get(c)) for c in columns))
    return table


@team_app.command("add")
def team_add(
    name: Name,
    unix_user: Annotated[str | None, typer.Option(help="Unix user its jobs run as (root server)")] = None,
    url: UrlOpt = DEFAULT_URL, token: TokenOpt = None,
) -> None:
    """Create a team."""
    body: dict = {"name": name, **({"unix_user": unix_user} if unix_user else {})}
    with connect(url, token) as client:
        team = client.request("POST", "/teams", json=body)
    console.print(f"team {team['name']} created", highlight=False)
    console.print(team["isolation"], style="dim", highlight=False)


@team_app.command("list")
def team_list(url: UrlOpt = DEFAULT_URL, token: TokenOpt = None) -> None:
    """Every team (yours, unless you are an admin): limits, slots held, usage, fair-share rank."""
    with connect(url, token) as client:
        teams = client.request("GET", "/teams")
    console.print(standing_rows(teams))


@team_app.command("set")
def team_set(
    name: Name,
    max_slots: Annotated[int | None, typer.Option(min=0, help="slots held at once")] = None,
    slot_hours: Annotated[float | None, typer.Option(min=0, help="budget per period")] = None,
    period: Annotated[str | None, typer.Option(help="month | rolling_30d")] = None,
    no_quota: Annotated[bool, typer.Option("--no-quota", help="no limit at all")] = False,
    share: Annotated[float | None, typer.Option(help="fair-share weight (default 1)")] = None,
    max_priority: Annotated[int | None, typer.Option(help="members' highest priority")] = None,
    slurm_account: Annotated[str | None, typer.Option(help="sbatch --account")] = None,
    slurm_qos: Annotated[str | None, typer.Option(help="sbatch --qos")] = None,
    url: UrlOpt = DEFAULT_URL, token: TokenOpt = None,
) -> None:
    """Change a team's quota, share, priority cap or Slurm account (admin); quota fields not
    given keep their value."""
    body: dict = {k: v for k, v in (("share", share), ("max_priority", max_priority),
                                    ("slurm_account", slurm_account), ("slurm_qos", slurm_qos))
                  if v is not None}
    with connect(url, token) as client:
        if no_quota:
            body["quota"] = None
        else:  # merged into the team's quota by the server (a JSON merge patch)
            changed = {"max_slots": max_slots, "slot_hours": slot_hours, "period": period}
            if quota := {k: v for k, v in changed.items() if v is not None}:
                body["quota"] = quota
        team = client.request("PATCH", f"/teams/{name}", json=body)
    console.print(standing_rows([team]))


@user_app.command("add")
def user_add(
    name: Name,
    team: Annotated[str | None, typer.Option(help="required for a member or viewer")] = None,
    role: Annotated[str, typer.Option(help="admin | member | viewer")] = "member",
    url: UrlOpt = DEFAULT_URL, token: TokenOpt = None,
) -> None:
    """Create a user."""
    with connect(url, token) as client:
        user = client.request("POST", "/users", json={"name": name, "team": team, "role": role})
    console.print(f"user {user['name']} ({user['role']}, team {user['team'] or '-'}) created",
                  highlight=False)


@user_app.command("list")
def user_list(url: UrlOpt = DEFAULT_URL, token: TokenOpt = None) -> None:
    """Every user."""
    with connect(url, token) as client:
        users = client.request("GET", "/users")
    console.print(_table(["name", "team", "role", "disabled"], users))


@user_app.command("disable")
def user_disable(
    name: Name,
    enable: Annotated[bool, typer.Option("--enable", help="enable again instead")] = False,
    url: UrlOpt = DEFAULT_URL, token: TokenOpt = None,
) -> None:
    """Disable a user: every token and JWT of theirs is refused at once."""
    with connect(url, token) as client:
        user = client.request("PATCH", f"/users/{name}", json={"disabled": not enable})
    console.print(f"user {user['name']} {'disabled' if user['disabled'] else 'enabled'}",
                  highlight=False)


def _me(url: str, token: str | None) -> dict:
    with connect(url, token) as client:
        return client.request("GET", "/me")


@token_app.command("create")
def token_create(
    name: Annotated[str, typer.Argument(help="what it is for: laptop, ci, …")],
    user: Annotated[str | None, typer.Option(help="whose (default: yours)")] = None,
    days: Annotated[int, typer.Option(min=1, max=3650, help="valid this many days")] = 90,
    url: UrlOpt = DEFAULT_URL, token: TokenOpt = None,
) -> None:
    """Create a token and print it: shown this once, the server keeps only its hash."""
    owner = user or _me(url, token)["user"]
    with connect(url, token) as client:
        made = client.request("POST", f"/users/{owner}/tokens",
                              json={"name": name, "expires_in_days": days})
    typer.echo(made["token"])
    err_console.print(f"token {made['id']} of {owner}, expires {made['expires_at']}; store "
                      "it now, it is not shown again", style="dim", highlight=False)


@token_app.command("list")
def token_list(
    user: Annotated[str | None, typer.Option(help="whose (default: yours)")] = None,
    url: UrlOpt = DEFAULT_URL, token: TokenOpt = None,
) -> None:
    """Your tokens (never the tokens themselves)."""
    owner = user or _me(url, token)["user"]
    with connect(url, token) as client:
        tokens = client.request("GET", f"/users/{owner}/tokens")
    console.print(_table(["id", "name", "created_at", "expires_at", "last_used_at", "revoked"],
                         tokens))


@token_app.command("revoke")
def token_revoke(
    token_id: Annotated[int, typer.Argument(min=1, help="the token's id (token list)")],
    url: UrlOpt = DEFAULT_URL, token: TokenOpt = None,
) -> None:
    """Revoke a token at once."""
    with connect(url, token) as client:
        client.request("DELETE", f"/tokens/{token_id}")
    console.print(f"token {token_id} revoked", highlight=False)


def whoami(url: UrlOpt = DEFAULT_URL, token: TokenOpt = None) -> None:
    """Who the server takes you for: user, team, role, token."""
    me = _me(url, token)
    token_text = f", token {me['token_id']}" if me["token_id"] else ""
    console.print(f"{me['user']} ({me['role']}, team {me['team'] or '-'}, via {me['via']}"
                  f"{token_text})", highlight=False)


def audit(
    actor: Annotated[str | None, typer.Option(help="only this user's entries")] = None,
    after: Annotated[int, typer.Option(min=0, help="entries after this id")] = 0,
    limit: Annotated[int, typer.Option(min=1, max=1000)] = 100,
    url: UrlOpt = DEFAULT_URL, token: TokenOpt = None,
) -> None:
    """The audit log (admin), oldest first from --after."""
    params: dict = {"after": after, "limit": limit, **({"actor": actor} if actor else {})}
    with connect(url, token) as client:
        page = client.request("GET", "/audit", params=params)
    console.print(_table(["id", "at", "actor", "method", "route", "target", "status", "client"],
                         page["items"]))
    console.print(f"next: --after {page['next_after']}", style="dim", highlight=False)


def register(app: typer.Typer) -> None:
    app.add_typer(team_app, name="team")
    app.add_typer(user_app, name="user")
    app.add_typer(token_app, name="token")
    app.command()(whoami)
    app.command()(audit)
    app.command()(usage)
