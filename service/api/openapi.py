"""The published OpenAPI document (``GET /openapi.json``, checked in as ``docs/openapi.json``).

FastAPI builds it from the routes and the pydantic models that validate requests, so every bound
the server enforces is the one the document states. This module only finishes it:

* models a route validates itself (the record batch, parsed in one pass for speed) are added to
  ``components`` and referenced from there, like every other body;
* the event stream is described as OpenAPI 3.1 can say it (``itemSchema`` is a 3.2 keyword);
* error answers are JSON on every route, also where the success answer is not (SSE, Prometheus);
* each operation says which token it takes, as this server is configured;
* the job a submission returns links (OpenAPI ``links``) to every operation on that job, so
  clients and stateful fuzzers know that ``id`` feeds ``{job_id}``.

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
# One event of the stream. OpenAPI 3.1 has no ``itemSchema`` (3.2); before 3.2 the convention,
# which tools such as schemathesis follow, is that ``schema`` of text/event-stream is one event.
EVENT_STREAM_SCHEMA = {
    "type": "object",
    "description": "One Server-Sent Event (the schema of each event, as before OpenAPI 3.2). "
    "`event: state`: data is the job, as GET /jobs/{job_id}; `event: metric`: data is one "
    "record, as an item of GET /jobs/{job_id}/metrics. `id` is the cursor to send back as "
    "Last-Event-ID.",
    "required": ["event", "data", "id"],
    "properties": {
        "event": {"type": "string", "enum": ["state", "metric"]},
        "id": {"type": "string", "pattern": "^[0-9]{1,18}-(?:-1|[0-3])$"},
        "data": {
            "type": "string",
            "contentMediaType": JSON,
            "contentSchema": {"oneOf": [{"$ref": "#/components/schemas/JobRead"},
                                        {"$ref": "#/components/schemas/MetricRead"}]},
        },
        "retry": {"type": "integer", "minimum": 0},
    },
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
    _link_submit_to_job_operations(schema.get("paths", {}))
    for path, operations in schema.get("paths", {}).items():
        for method, operation in operations.items():
            _json_errors(operation)
            if worker_job_id(method.upper(), path.replace("{job_id}", "1")) is not None:
                operation["security"] = [{"jobToken": []}]
            elif api_tokens and not is_public(path):
                operation["security"] = [{"apiToken": []}]
    return schema


def _link_submit_to_job_operations(paths: dict) -> None:
    """``POST /jobs`` → each operation on ``/jobs/{job_id}...`` but the ranks' own."""
    links = {
        operation["operationId"]: {
            "operationId": operation["operationId"],
            "parameters": {"job_id": "$response.body#/id"},
            "description": f"{method.upper()} {path} on the job just submitted",
        }
        for path, operations in paths.items() if path.startswith("/jobs/{job_id}")
        for method, operation in operations.items()
        if worker_job_id(method.upper(), path.replace("{job_id}", "1")) is None
    }
    submit = paths.get("/jobs", {}).get("post", {}).get("responses", {})
    for status in ("200", "201"):
        if status in submit:
            submit[status]["links"] = links


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
