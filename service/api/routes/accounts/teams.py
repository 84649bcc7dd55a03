"""Team routes: admins create and change teams; anyone signed in reads their own team (admins:
every team), with where it stands — slots held and borrowed, recent usage, fair-share factor
and rank, the budget's period (``service.domain.queue.standing``). A team is never deleted: its
name stays on its jobs and in the audit log."""

import time
from typing import Annotated

from fastapi import APIRouter, Path, Request, Response

from service.api.deps import CallerDep, hidden
from service.api.errors import ERROR_RESPONSES, ApiError
from service.api.identityschemas import NAME_PATTERN, TeamCreate, TeamPatch, TeamRead
from service.domain.identity.accounts import AccountRefused, Accounts, isolation
from service.domain.queue.standing import Standing, Standings
from service.store.tables import Team

router = APIRouter(prefix="/teams", tags=["identity"])
TeamName = Annotated[str, Path(pattern=NAME_PATTERN, description="the team's name")]
_UNIX_USER = {422: {**ERROR_RESPONSES[422], "description": "an invalid field; unix_user not a "
              "user of this host, root, or the server's own user"}}


def accounts(request: Request) -> Accounts:
    return request.app.state.accounts


def standings(request: Request) -> dict[str, Standing]:
    """Every team's standing now (this process's ledger, brought up to date)."""
    keeper: Standings = request.app.state.standings
    with request.app.state.read_session_factory() as session:
        return keeper.read(session, time.time())


def refused(exc: AccountRefused) -> ApiError:
    """The refusal as an answer; a 422 names its field in ``details`` too."""
    details = [{"field": exc.field, "message": str(exc).removeprefix(f"{exc.field}: ")}] \
        if exc.field and exc.status == 422 else None
    return ApiError(exc.status, exc.kind, str(exc), details=details)


def _read(team: Team, request: Request) -> TeamRead:
    return TeamRead.from_row(team, isolation(team), standings(request).get(team.name))


@router.post("", status_code=201, response_model=TeamRead, responses={
    409: {**ERROR_RESPONSES[409], "description": "a team of that name exists"}, **_UNIX_USER})
def create_team(body: TeamCreate, request: Request, response: Response) -> TeamRead:
    """A new team; its settings as ``PATCH`` takes them."""
    try:
        team = accounts(request).create_team(body.name, body.model_dump(mode="json",
                                                                        exclude={"name"}))
    except AccountRefused as exc:
        raise refused(exc) from exc
    response.headers["Location"] = f"/teams/{team.name}"
    return _read(team, request)


@router.get("", response_model=list[TeamRead])
def list_teams(request: Request, caller: CallerDep) -> list[TeamRead]:
    """Every team (admins), or the caller's own; each with where it stands (``usage``,
    ``fair_share``: its rank among every team)."""
    found = standings(request)
    return [TeamRead.from_row(t, isolation(t), found.get(t.name))
            for t in accounts(request).teams() if caller.sees(t.name)]


@router.get("/{name}", response_model=TeamRead)
def get_team(name: TeamName, request: Request, caller: CallerDep) -> TeamRead:
    """The team, with ``isolation`` (what keeps its jobs apart from other teams' on this host)
    and where it stands. Another team's is 404, as a missing one."""
    if not caller.sees(name):
        raise hidden(request, "team", f"team {name!r} not found")
    try:
        return _read(accounts(request).team(name), request)
    except AccountRefused as exc:
        raise refused(exc) from exc


@router.patch("/{name}", response_model=TeamRead, responses=_UNIX_USER)
def update_team(name: TeamName, body: TeamPatch, request: Request) -> TeamRead:
    """Change the fields sent (``null`` clears one); a raised quota or budget lets its queued
    jobs start on the supervisor's next pass."""
    try:
        team = accounts(request).update_team(name, body.model_dump(mode="json",
                                                                   exclude_unset=True))
    except AccountRefused as exc:
        raise refused(exc) from exc
    request.app.state.supervisor.queue_changed()
    return _read(team, request)
