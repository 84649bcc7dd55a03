"""User and token routes: users are an admin's (create, list, change: role, team,
``disabled``); a user's tokens are theirs and an admin's (made, listed, revoked); ``GET /me``
is anyone's. The rules are ``service.api.authz``'s."""

from typing import Annotated

from fastapi import APIRouter, Path, Request, Response

from service.api.deps import CallerDep, hidden
from service.api.errors import ERROR_RESPONSES
from service.api.identityschemas import (
    NAME_PATTERN,
    Me,
    TokenCreate,
    TokenCreated,
    TokenRead,
    UserCreate,
    UserPatch,
    UserRead,
)
from service.api.middleware.auth import PrincipalDep
from service.api.routes.accounts.teams import accounts, refused
from service.domain.identity.accounts import AccountRefused

router = APIRouter(tags=["identity"])
UserName = Annotated[str, Path(pattern=NAME_PATTERN, description="the user's name")]
TOKEN_ID_MAX = 2**31 - 1
_TEAM = {422: {**ERROR_RESPONSES[422], "description": "an invalid field; a member or viewer "
         "without a team, or a team that does not exist"}}


@router.get("/me", response_model=Me)
def me(principal: PrincipalDep, caller: CallerDep) -> Me:
    """Who the token names: user, team, role, the personal token's id, how they signed in."""
    return Me(user=caller.user, team=caller.team, role=caller.role,
              token_id=principal.token_id, via=principal.via.value)  # type: ignore[arg-type]


@router.post("/users", status_code=201, response_model=UserRead, responses={
    409: {**ERROR_RESPONSES[409], "description": "a user of that name exists"}, **_TEAM})
def create_user(body: UserCreate, request: Request, response: Response) -> UserRead:
    try:
        user = accounts(request).create_user(body.name, body.team, body.role)
    except AccountRefused as exc:
        raise refused(exc) from exc
    response.headers["Location"] = f"/users/{user.name}"
    return UserRead.from_row(user)


@router.get("/users", response_model=list[UserRead])
def list_users(request: Request) -> list[UserRead]:
    return [UserRead.from_row(u) for u in accounts(request).users()]


@router.patch("/users/{name}", response_model=UserRead, responses=_TEAM)
def update_user(name: UserName, body: UserPatch, request: Request) -> UserRead:
    """Change role, team or ``disabled`` (a disabled user's tokens are refused at once)."""
    fields = body.model_dump(exclude_unset=True)
    try:
        return UserRead.from_row(accounts(request).update_user(name, fields))
    except AccountRefused as exc:
        raise refused(exc) from exc


@router.post("/users/{name}/tokens", status_code=201, response_model=TokenCreated)
def create_token(
    name: UserName, body: TokenCreate, request: Request, response: Response,
) -> TokenCreated:
    """A personal token for ``name`` (an admin's, or the user's own): ``ty_`` and 43 random
    characters, answered this once; the server keeps only its SHA-256."""
    try:
        row, token = accounts(request).create_token(name, body.name, body.expires_in_days)
    except AccountRefused as exc:
        raise refused(exc) from exc
    request.app.state.signin.close()  # this process: callers need a token from now on
    response.headers["Location"] = f"/tokens/{row.id}"
    assert row.expires_at is not None
    return TokenCreated(id=row.id, name=row.name, token=token, expires_at=row.expires_at)


@router.get("/users/{name}/tokens", response_model=list[TokenRead])
def list_tokens(name: UserName, request: Request) -> list[TokenRead]:
    """Id, name, created, expires, last used, revoked: never the token."""
    try:
        return [TokenRead.from_row(t) for t in accounts(request).tokens(name)]
    except AccountRefused as exc:
        raise refused(exc) from exc


@router.delete("/tokens/{token_id}", status_code=204, response_class=Response)
def revoke_token(
    token_id: Annotated[int, Path(ge=1, le=TOKEN_ID_MAX)], request: Request, caller: CallerDep,
) -> Response:
    """Revoke a token at once (the next request with it is a 401); a user may revoke their
    own, an admin anyone's. Someone else's token id answers 404, as a missing one."""
    owner = accounts(request).token_user(token_id)
    if owner is None or not (caller.admin or owner == caller.user):
        raise hidden(request, f"token {token_id}")
    try:
        accounts(request).revoke_token(token_id)
    except AccountRefused as exc:
        raise refused(exc) from exc
    return Response(status_code=204)
