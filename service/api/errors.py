"""One JSON error shape for every failure: ``{"error", "message", "details": [{"field", "message"}]}``.

No handler puts a traceback or an exception's internals in a response; unexpected errors are
logged (without request headers, so no token reaches the log) and answered with a bare 500.
A database that is busy (a lock held elsewhere past ``TORCHYARD_DB_LOCK_TIMEOUT_S``, see
``service.store.db.is_busy``) or unreachable is a 503 with ``Retry-After``, never a 500: the request
can be retried as it is (record batches and keyed submits are idempotent).
"""

import logging
import math
import re

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DBAPIError
from starlette.exceptions import HTTPException as StarletteHTTPException

from service.api.schemas import ErrorBody
from service.domain.intake.admission import AdmissionRefused
from service.store.db import is_busy
from torchyard_contract.confinement import PathRefused

logger = logging.getLogger(__name__)


class ApiError(Exception):
    def __init__(
        self, status: int, error: str, message: str, headers: dict[str, str] | None = None,
        details: list[dict] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.error, self.message = status, error, message
        self.headers, self.details = headers, details


def error_body(error: str, message: str, details: list[dict] | None = None) -> dict:
    return {"error": error, "message": message, "details": details or []}


def _field_name(loc: tuple) -> str:
    parts = [str(p) for p in loc if p not in ("body", "query", "path", "header")]
    return ".".join(parts) or "body"


# A model-level check names its field as "field: message" (see torchyard_contract.spec); its
# error sits at the model (the body, or a nested model such as a sweep's "spec"), whose input
# is an object.
_NAMED = re.compile(r"^(?:Value error, )?([A-Za-z_][A-Za-z0-9_.]*): (.+)$", re.DOTALL)


def _detail(err: dict) -> dict[str, str]:
    field, message = _field_name(tuple(err.get("loc", ()))), _describe(err)
    at_model = field == "body" or isinstance(err.get("input"), dict)
    named = _NAMED.match(message) if at_model else None
    if named is not None:
        field = named[1] if field == "body" else f"{field}.{named[1]}"
        message = named[2]
    return {"field": field, "message": message.removeprefix("Value error, ")}


def _describe(err: dict) -> str:
    ctx = err.get("ctx") or {}
    if err.get("type") == "enum" and "expected" in ctx:
        return f"must be one of {ctx['expected']}; got {err.get('input')!r}"
    if err.get("type") == "extra_forbidden":
        return "unknown field"
    if err.get("type") == "literal_error" and "expected" in ctx:
        return f"must be a number or one of {ctx['expected']}"
    return str(err.get("msg", "invalid"))


# Errors are JSON even on routes whose own responses are not (the SSE stream, Prometheus text):
# name the media type, or FastAPI documents the error under the route's content type.
_ERROR = {
    "model": ErrorBody,
    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}},
}
# Declared on every operation (app-level ``responses``), so clients and the fuzzer know them.
ERROR_RESPONSES: dict[int | str, dict] = {
    400: {**_ERROR, "description": "malformed request (e.g. a body that is not JSON)"},
    401: {**_ERROR, "description": "sign-in is on and no token was sent, or one that is unknown, "
          "revoked, expired, a disabled user's, or a JWT the server refuses "
          "(WWW-Authenticate: Bearer error=\"invalid_token\")"},
    403: {**_ERROR, "description": "the caller's role may not do this (docs/security.md, the role "
          "× route table), or a job token off its route"},
    404: {**_ERROR, "description": "no such job or route; a job, sweep or package of another "
          "team answers the same"},
    409: {**_ERROR, "description": "conflicts with the job's state"},
    413: {**_ERROR, "description": "the body is larger than TORCHYARD_MAX_BODY_BYTES"},
    415: {**_ERROR, "description": "a request body that is not application/json"},
    422: {**_ERROR, "description": "invalid field, unknown field, or out-of-range number"},
    500: {**_ERROR, "description": "a bug; the response carries no details"},
    503: {**_ERROR, "description": "the database is busy (a lock another process holds) or "
          "unreachable; retry after Retry-After seconds"},
}


# The records route's 503 has one more cause: the next attempt has not been recorded yet.
RETRY_LATER: dict[int | str, dict] = {
    503: {**_ERROR, "description": "not ready for this yet (the next attempt is not recorded "
          "yet), or the database is busy; retry after Retry-After seconds"},
}


def unavailable(lock_timeout_s: float, why: str) -> ApiError:
    """503 for a request that met a busy database: retry after as long as the server waits for
    a lock (at least 1 s)."""
    retry_s = max(1, math.ceil(lock_timeout_s))
    return ApiError(503, "unavailable", f"{why}; retry after {retry_s} s",
                    {"Retry-After": str(retry_s)})


def _busy_response(req: Request, exc: Exception) -> JSONResponse:
    logger.warning("database busy on %s %s: %s", req.method, req.url.path,
                   getattr(exc, "orig", exc))
    busy = unavailable(req.app.state.settings.db_lock_timeout_s,
                       "the database is busy (a lock held by another process) or unreachable")
    return JSONResponse(error_body(busy.error, busy.message), busy.status, headers=busy.headers)


def _allowed_methods(app: FastAPI, path: str) -> list[str]:
    """Every method the schema documents for ``path``.

    Starlette's 405 names only the first route whose path matched, but ``GET /jobs`` and
    ``POST /jobs`` are separate routes; ``Allow`` must list both.
    """
    methods: set[str] = set()
    for template, operations in app.openapi().get("paths", {}).items():
        pattern = re.sub(r"\\\{[^/]*?\\\}", "[^/]+", re.escape(template))
        if re.fullmatch(pattern, path):
            methods.update(m.upper() for m in operations)
    if "GET" in methods:
        methods.add("HEAD")  # service.api.middleware.head
    return sorted(methods)


def install(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(_req: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(
            error_body(exc.error, exc.message, exc.details), status_code=exc.status,
            headers=exc.headers,
        )

    @app.exception_handler(RequestValidationError)
    async def _validation(_req: Request, exc: RequestValidationError) -> JSONResponse:
        details = [
            _detail(e)
            for e in exc.errors()
        ]
        summary = "; ".join(f"{d['field']}: {d['message']}" for d in details[:5])
        return JSONResponse(error_body("invalid_request", summary, details), status_code=422)

    @app.exception_handler(PathRefused)
    async def _path(_req: Request, exc: PathRefused) -> JSONResponse:
        details = [{"field": exc.field, "message": str(exc)}]
        return JSONResponse(error_body("invalid_request", str(exc), details), status_code=422)

    @app.exception_handler(AdmissionRefused)
    async def _admission(_req: Request, exc: AdmissionRefused) -> JSONResponse:
        return JSONResponse(error_body("forbidden", str(exc)), status_code=403)

    @app.exception_handler(OverflowError)
    async def _overflow(_req: Request, _exc: OverflowError) -> JSONResponse:
        # A number that passed an unbounded declaration but does not fit a 64-bit column.
        return JSONResponse(
            error_body("invalid_request", "a number in the request is out of range"), 422
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http(req: Request, exc: StarletteHTTPException) -> JSONResponse:
        headers = dict(exc.headers or {})
        if exc.status_code == 405 and (allowed := _allowed_methods(req.app, req.url.path)):
            headers["Allow"] = ", ".join(allowed)
        return JSONResponse(
            error_body("http_error", str(exc.detail)), status_code=exc.status_code, headers=headers
        )

    @app.exception_handler(DBAPIError)
    async def _database(req: Request, exc: DBAPIError) -> JSONResponse:
        if is_busy(exc):
            return _busy_response(req, exc)
        return await _unexpected(req, exc)

    @app.exception_handler(Exception)
    async def _unexpected(req: Request, exc: Exception) -> JSONResponse:
        # Also what a middleware's error reaches (the token check reads the database).
        if is_busy(exc):
            return _busy_response(req, exc)
        logger.error("unhandled error on %s %s", req.method, req.url.path, exc_info=exc)
        return JSONResponse(error_body("internal", "internal server error"), status_code=500)
