"""Team routes (admin only, ``service.api.authz``): create, list, read, change. A team is never
deleted: its name stays on its jobs and in the audit log."""

from typing import Annotated

from fastapi import APIRouter, Path, Request, Response

from service.api.errors import ERROR_RESPONSES, ApiError
from service.api.identityschemas import NAME_PATTERN, TeamCreate, TeamPatch, TeamRead
from service.domain.identity.accounts import AccountRefused, Accounts, isolation

router = APIRouter(prefix="/teams", tags=["identity"])
TeamName = Annotated[str, Path(pattern=NAME_PATTERN, description="the team's name")]
_UNIX_USER = {422: {**ERROR_RESPONSES[422], "description": "an invalid field; unix_user not a "
              "user of this host, root, or the server's own user"}}


def accounts(request: Request) -> Accounts:
    return request.app.state.accounts


def refused(exc: AccountRefused) -> ApiError:
    """The refusal as an answer; a 422 names its field in ``details`` too."""
    details = [{"field": exc.field, "message": str(exc).removeprefix(f"{exc.field}: ")}] \
        if exc.field and exc.status == 422 else None
    return ApiError(exc.status, exc.kind, str(exc), details=details)


def _read(team: object) -> TeamRead:
    return TeamRead.from_row(team, isolation(team))  # type: ignore[arg-type]


@router.post("", status_code=201, response_model=TeamRead, responses={
    409: {**ERROR_RESPONSES[409], "description": "a team of that name exists"}, **_UNIX_USER})
def create_team(body: TeamCreate, request: Request, response: Response) -> TeamRead:
    """A new team; its settings as ``PATCH`` takes them."""
    try:
        team = accounts(request).create_team(body.name, body.model_dump(exclude={"name"}))
    except AccountRefused as exc:
        raise refused(exc) from exc
    response.headers["Location"] = f"/teams/{team.name}"
    return _read(team)


@router.get("", response_model=list[TeamRead])
def list_teams(request: Request) -> list[TeamRead]:
    return [_read(t) for t in accounts(request).teams()]


@router.get("/{name}", response_model=TeamRead)
def get_team(name: TeamName, request: Request) -> TeamRead:
    """The team, with ``isolation``: what keeps its jobs apart from other teams' on this host."""
    try:
        return _read(accounts(request).team(name))
    except AccountRefused as exc:
        raise refused(exc) from exc


@router.patch("/{name}", response_model=TeamRead, responses=_UNIX_USER)
def update_team(name: TeamName, body: TeamPatch, request: Request) -> TeamRead:
    """Change the fields sent (``null`` clears one)."""
    try:
        return _read(accounts(request).update_team(name, body.model_dump(exclude_unset=True)))
    except AccountRefused as exc:
        raise refused(exc) from exc
