"""One JSON error shape for every failure: ``{"error", "message", "details": [{"field", "message"}]}``."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

logger = logging.getLogger(__name__)


class ApiError(Exception):
    def __init__(self, status: int, error: str, message: str) -> None:
        super().__init__(message)
        self.status, self.error, self.message = status, error, message


def _body(error: str, message: str, details: list[dict] | None = None) -> dict:
    return {"error": error, "message": message, "details": details or []}


def _field_name(loc: tuple) -> str:
    parts = [str(p) for p in loc if p not in ("body", "query", "path", "header")]
    return ".".join(parts) or "body"


def _describe(err: dict) -> str:
    ctx = err.get("ctx") or {}
    if err.get("type") == "enum" and "expected" in ctx:
        return f"must be one of {ctx['expected']}; got {err.get('input')!r}"
    if err.get("type") == "extra_forbidden":
        return "unknown field"
    if err.get("type") == "literal_error" and "expected" in ctx:
        return f"must be a number or one of {ctx['expected']}"
    return str(err.get("msg", "invalid"))


def install(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(_req: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(_body(exc.error, exc.message), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def _validation(_req: Request, exc: RequestValidationError) -> JSONResponse:
        details = [
            {"field": _field_name(tuple(e.get("loc", ()))), "message": _describe(e)}
            for e in exc.errors()
        ]
        summary = "; ".join(f"{d['field']}: {d['message']}" for d in details[:5])
        return JSONResponse(_body("invalid_request", summary, details), status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_req: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(
            _body("http_error", str(exc.detail)), status_code=exc.status_code, headers=exc.headers
        )

    @app.exception_handler(Exception)
    async def _unexpected(req: Request, exc: Exception) -> JSONResponse:
        logger.exception("unhandled error on %s %s", req.method, req.url.path)
        return JSONResponse(_body("internal", "internal server error"), status_code=500)
