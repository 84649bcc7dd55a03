"""The published OpenAPI document (``GET /openapi.json``, checked in as ``docs/openapi.json``).

FastAPI builds it from the routes and the pydantic models that validate requests, so every bound
the server enforces is the one the document states. This module only finishes it:

* models a route validates itself (the record batch, parsed in one pass for speed) are added to
  ``components`` and referenced from there, like every other body;
* the event stream is described as OpenAPI 3.1 can say it (``itemSchema`` is a 3.2 keyword);
* error answers are JSON on every route, also where the success answer is not (SSE, Prometheus);
* each operation says which token it takes, as this server is configured.

Contract: :func:`build_openapi` is pure given the app's routes and ``api_tokens``.
"""

from __future__ import annotations

from collections.abc import Sequence

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from service.api.auth import is_public, worker_job_id

COMPONENT_REF = "#/components/schemas/{model}"
EVENT_STREAM = "text/event-stream"
JSON = "application/json"
DESCRIPTION = """\
Runs PyTorch DDP training jobs and keeps everything they report.

Errors are always JSON: `{"error", "message", "details": [{"field", "message"}]}`.
Within this API version changes are additive only (new operations, new optional request
fields, new response fields, new enum values in responses); see docs/api.md."""
EVENT_STREAM_SCHEMA = {
    "type": "string",
    "description": "Server-Sent Events. `event: state`: data is the job (as GET /jobs/{job_id}); "
    "`event: metric`: data is one record (as an item of GET /jobs/{job_id}/metrics). Every `id` "
    "is a cursor '<seq>-<stage>' to send back as Last-Event-ID.",
}


def build_openapi(
    app: FastAPI, *, api_tokens: bool, body_models: Sequence[type[BaseModel]] = ()
) -> dict:
    """The document for ``app``; ``body_models`` are request bodies that routes parse themselves
    and reference as ``#/components/schemas/<Model>``."""
    schema = get_openapi(
        title=app.title, version=app.version, routes=app.routes, description=DESCRIPTION
    )
    components = schema.setdefault("components", {})
    _add_models(components.setdefault("schemas", {}), body_models)
    schemes = components.setdefault("securitySchemes", {})
    schemes["jobToken"] = {"type": "http", "scheme": "bearer",
                           "description": "the job's own token (ranks only)"}
    if api_tokens:
        schemes["apiToken"] = {"type": "http", "scheme": "bearer",
                               "description": "one of TORCHYARD_API_TOKENS"}
    for path, operations in schema.get("paths", {}).items():
        for method, operation in operations.items():
            _json_errors(operation)
            if worker_job_id(method.upper(), path.replace("{job_id}", "1")) is not None:
                operation["security"] = [{"jobToken": []}]
            elif api_tokens and not is_public(path):
                operation["security"] = [{"apiToken": []}]
    return schema


def _add_models(schemas: dict, models: Sequence[type[BaseModel]]) -> None:
    if not models:
        return
    _, defs = models_json_schema([(m, "validation") for m in models], ref_template=COMPONENT_REF)
    for name, model_schema in defs.get("$defs", {}).items():
        schemas.setdefault(name, model_schema)


def _json_errors(operation: dict) -> None:
    """Success answers keep their media type (an SSE stream as a 3.1 string schema); error
    answers are JSON only."""
    for status, response in operation.get("responses", {}).items():
        content = response.get("content")
        if not content:
            continue
        if status.startswith(("4", "5")) and JSON in content:
            response["content"] = {JSON: content[JSON]}
        elif EVENT_STREAM in content:
            content[EVENT_STREAM] = {"schema": EVENT_STREAM_SCHEMA}
