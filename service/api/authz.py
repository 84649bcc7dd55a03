"""Who may do what, as data: every route (method, path template) → one :class:`Rule`.

The middleware (``service.api.middleware.auth``) says who is calling; :func:`authorize`, a
dependency of every route, checks the caller's role against this table before the route runs.
The team part of a rule ("of the target's team") is checked where the target is loaded, once:
``service.api.deps`` (``JobDep``, ``SweepDep``) and the list queries answer another team's job
or sweep exactly as one that does not exist (404), so ids reveal nothing. A route missing
from the table is refused (403), and ``tests/security/test_roles.py`` fails for it; the table
in docs/security.md is generated from this one (``python -m tools.docgen``).
"""

import re
from dataclasses import dataclass
from enum import Enum

from fastapi import Request
from fastapi.routing import APIRoute

from service.api.errors import ApiError
from service.api.middleware.auth import get_principal
from service.api.middleware.signin import Principal, Via
from service.domain.identity.caller import Role


class Rule(str, Enum):
    public = "public"  # no token
    job_token = "job token"  # the job's own token, its ranks' records
    signed_in = "signed in"  # any user; what a list shows is scoped to the caller's team
    team_viewer = "viewer of the target's team"
    member = "member"  # creates something of the caller's own team
    team_member = "member of the target's team"
    admin = "admin"
    self_or_admin = "the user themself, or admin"


@dataclass(frozen=True)
class Cells:
    """What each role may do under a rule, as the docs' table says it."""

    admin: str
    member: str
    viewer: str


CELLS = {
    Rule.public: Cells("yes", "yes", "yes"),
    Rule.job_token: Cells("no", "no", "no"),
    Rule.signed_in: Cells("yes", "yes (own team's)", "yes (own team's)"),
    Rule.team_viewer: Cells("any team", "own team", "own team"),
    Rule.member: Cells("yes", "as own team", "no"),
    Rule.team_member: Cells("any team", "own team", "no"),
    Rule.admin: Cells("yes", "no", "no"),
    Rule.self_or_admin: Cells("anyone's", "own", "own"),
}

_JOB = "/jobs/{job_id}"
RULES: dict[tuple[str, str], Rule] = {
    # the public shell and the reference page (they hold no data)
    ("GET", "/"): Rule.public,
    ("GET", "/docs"): Rule.public,
    ("GET", "/healthz"): Rule.public,
    ("GET", "/static/{name}"): Rule.public,
    ("GET", "/static/swagger/{name}"): Rule.public,
    # the ranks
    ("POST", f"{_JOB}/records"): Rule.job_token,
    # anyone signed in; lists are the caller's team's
    ("GET", "/openapi.json"): Rule.signed_in,
    ("GET", "/me"): Rule.signed_in,
    ("GET", "/resources"): Rule.signed_in,
    ("GET", "/progress"): Rule.signed_in,
    ("GET", "/jobs"): Rule.signed_in,
    ("GET", "/sweeps"): Rule.signed_in,
    ("GET", "/packages/{digest}"): Rule.signed_in,
    ("GET", "/usage"): Rule.signed_in,  # admins: everyone's; others: their team's
    ("GET", "/teams"): Rule.signed_in,  # admins: every team; others: their own
    # reading one job or sweep
    ("GET", _JOB): Rule.team_viewer,
    ("GET", f"{_JOB}/wait"): Rule.team_viewer,
    ("GET", f"{_JOB}/attempts"): Rule.team_viewer,
    ("GET", f"{_JOB}/metrics"): Rule.team_viewer,
    ("GET", f"{_JOB}/metrics/summary"): Rule.team_viewer,
    ("GET", f"{_JOB}/series"): Rule.team_viewer,
    ("GET", f"{_JOB}/logs"): Rule.team_viewer,
    ("GET", f"{_JOB}/events"): Rule.team_viewer,
    ("GET", f"{_JOB}/artifacts"): Rule.team_viewer,
    ("GET", f"{_JOB}/artifacts/{{path:path}}"): Rule.team_viewer,
    ("GET", f"{_JOB}/stacks"): Rule.team_viewer,
    ("GET", f"{_JOB}/deliveries"): Rule.team_viewer,
    ("GET", "/sweeps/{sweep_id}"): Rule.team_viewer,
    ("GET", "/sweeps/{sweep_id}/series"): Rule.team_viewer,
    ("GET", "/teams/{name}"): Rule.team_viewer,  # its quota, usage and fair-share rank
    # making things, as the caller's team (a member's priority is capped by its team's
    # max_priority: Intake.check_team)
    ("POST", "/jobs"): Rule.member,
    ("POST", "/sweeps"): Rule.member,
    ("POST", "/packages"): Rule.member,
    # controlling one job or sweep
    ("POST", f"{_JOB}/cancel"): Rule.team_member,
    ("POST", f"{_JOB}/pause"): Rule.team_member,
    ("POST", f"{_JOB}/resume"): Rule.team_member,
    ("DELETE", _JOB): Rule.team_member,
    ("POST", "/sweeps/{sweep_id}/cancel"): Rule.team_member,
    # the box and who is who
    ("GET", "/metrics"): Rule.admin,  # Prometheus: every job's name and state
    ("GET", "/audit"): Rule.admin,
    ("POST", "/teams"): Rule.admin,
    ("PATCH", "/teams/{name}"): Rule.admin,
    ("POST", "/users"): Rule.admin,
    ("GET", "/users"): Rule.admin,
    ("PATCH", "/users/{name}"): Rule.admin,
    # a user's own tokens (the route answers 404 for someone else's token id)
    ("POST", "/users/{name}/tokens"): Rule.self_or_admin,
    ("GET", "/users/{name}/tokens"): Rule.self_or_admin,
    ("DELETE", "/tokens/{token_id}"): Rule.self_or_admin,
}


def rule_for(method: str, path: str) -> Rule | None:
    """The rule of a route (``HEAD`` is its ``GET``); None: the route has none (refused)."""
    return RULES.get(("GET" if method == "HEAD" else method, path))


def refusal(rule: Rule | None, principal: Principal, path_params: dict[str, object]) -> str | None:
    """Why ``principal`` may not use a route under ``rule``; None when it may (the team part
    of ``team_*`` rules is the target loader's)."""
    if rule is Rule.public:
        return None
    if rule is None:
        return "this route has no authorization rule (a bug: see service/api/authz.py)"
    if rule is Rule.job_token:
        return None if principal.via is Via.job else "only the job's own token posts its records"
    caller = principal.caller
    if caller is None:
        return "a job token may only post records for its own job"
    if rule in (Rule.signed_in, Rule.team_viewer):
        return None
    if rule in (Rule.member, Rule.team_member):
        if caller.role.at_least(Role.member):
            return None
        return f"user {caller.user} is a {caller.role.value}: this needs a member or an admin"
    if caller.admin:
        return None
    if rule is Rule.self_or_admin and path_params.get("name", caller.user) == caller.user:
        return None
    return f"user {caller.user} is a {caller.role.value}: this needs an admin"


async def authorize(request: Request) -> None:
    """Every route's first dependency: 403 unless the caller's role passes the route's rule.
    ``async``: it only reads the request (no hop to the thread pool)."""
    route = request.scope.get("route")
    if not isinstance(route, APIRoute):
        return  # /openapi.json and the like: the middleware asks for sign-in (Rule.signed_in)
    why = refusal(rule_for(request.method, route.path), get_principal(request),
                  request.path_params)
    if why is not None:
        raise ApiError(403, "forbidden", why)


def _pattern(template: str) -> re.Pattern[str]:
    parts = re.split(r"(\{[^}]+\})", template)
    return re.compile("".join(
        (".+" if p.endswith(":path}") else "[^/]+") if p.startswith("{") else re.escape(p)
        for p in parts))


_TEMPLATES = [(method, _pattern(path), path) for method, path in RULES]


def template_for(method: str, path: str) -> str | None:
    """The route template of a request that was refused before routing (the audit log's)."""
    method = "GET" if method == "HEAD" else method
    for rule_method, pattern, template in _TEMPLATES:
        if rule_method == method and pattern.fullmatch(path):
            return template
    return None
