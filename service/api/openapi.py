"""The published OpenAPI document (``GET /openapi.json``, checked in as ``docs/openapi.json``).

FastAPI builds it from the routes and the pydantic models that validate requests, so every bound
the server enforces is the one the document states. This module only finishes it:

* models a route validates itself (the record batch, parsed in one pass for speed) are added to
  ``components`` and referenced from there, like every other body;
* the event stream is described as OpenAPI 3.1 can say it (``itemSchema`` is a 3.2 keyword);
* error answers are JSON on every route, also where the success answer is not (SSE, Prometheus);
* each operation says which token it takes, as this server is configured, and who may call it
  (``x-torchyard-rule``, from ``service.api.authz``);
* the job a submission returns links (OpenAPI ``links``) to every operation on that job, so
  clients and stateful fuzzers know that ``id`` feeds ``{job_id}``;
* a server that runs each job on its own host (the local executor) states that bound too: a
  submission's ``nnodes`` is at most 1 and the Slurm fields can only be null, as it refuses
  anything else with a 422;
* every server states the webhook endpoints a submission's ``notify`` may name
  (``notify_bounds``), as they are when the document is asked for (:class:`ServedDocument`).

The checked-in ``docs/openapi.json`` is the generic document. Contract: :func:`build_openapi`
is pure given the app's routes, ``api_tokens`` and ``single_host``; :func:`notify_bounds` given
its document and names.
"""

import copy
import threading
from collections.abc import Sequence
from pathlib import Path

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from service.api.authz import rule_for
from service.api.middleware.auth import is_public, worker_job_id
from service.settings.webhookfile import endpoint_names
from torchyard_contract.spec import SLURM_FIELDS

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
    app: FastAPI, *, api_tokens: bool, body_models: Sequence[type[BaseModel]] = (),
    single_host: bool = False,
) -> dict:
    """The document for ``app``; ``body_models`` are request bodies that routes parse themselves
    and reference as ``#/components/schemas/<Model>``; ``single_host``: this server runs each
    job on its own host (``_single_host_bounds``)."""
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
                               "description": "a personal token (ty_…), an identity provider's "
                               "JWT, or one of TORCHYARD_API_TOKENS (acts as admin)"}
    _link_submit_to_job_operations(schema.get("paths", {}))
    _inline_request_bodies(schema)
    if single_host:
        _single_host_bounds(schema.get("paths", {}))
    for path, operations in schema.get("paths", {}).items():
        for method, operation in operations.items():
            _json_errors(operation)
            rule = rule_for(method.upper(), path)
            if rule is not None:
                operation["x-torchyard-rule"] = rule.value
            if worker_job_id(method.upper(), path.replace("{job_id}", "1")) is not None:
                operation["security"] = [{"jobToken": []}]
            elif api_tokens and not is_public(path):
                operation["security"] = [{"apiToken": []}]
    return schema


class ServedDocument:
    """``app.openapi`` of a server: the document built once from the routes
    (:func:`build_openapi`, kept as ``app.openapi_schema``), finished at each call with the
    webhook endpoints ``webhooks_file`` names then. The file is read at every submit, so an
    edited file changes what a submission may name without a restart; it is read at every
    request of the document too (a small JSON file), and the finished copy is rebuilt only
    when the names changed."""

    def __init__(
        self, app: FastAPI, *, api_tokens: bool, single_host: bool,
        webhooks_file: Path | None, body_models: Sequence[type[BaseModel]] = (),
    ) -> None:
        self.app, self.api_tokens, self.single_host = app, api_tokens, single_host
        self.webhooks_file, self.body_models = webhooks_file, body_models
        self._lock = threading.Lock()
        self._finished: tuple[tuple[str, ...], dict] | None = None

    def __call__(self) -> dict:
        names = endpoint_names(self.webhooks_file)
        with self._lock:
            if self.app.openapi_schema is None:
                self.app.openapi_schema = build_openapi(
                    self.app, api_tokens=self.api_tokens, body_models=self.body_models,
                    single_host=self.single_host,
                )
            if self._finished is None or self._finished[0] != names:
                self._finished = (names, notify_bounds(self.app.openapi_schema, names))
            return self._finished[1]


def notify_bounds(document: dict, names: Sequence[str]) -> dict:
    """A copy of ``document`` whose submissions' ``notify`` names only ``names``, as
    ``webhookfile.subscriptions`` refuses any other name (422): each item is one of them
    (``enum``), or the list is empty (``maxItems: 0``) when there are none. Both front doors:
    ``POST /jobs`` and a sweep's base ``spec`` (its trials take the same intake)."""
    bounded = copy.deepcopy(document)
    paths = bounded.get("paths", {})
    jobs = _body_properties(paths.get("/jobs", {}).get("post", {}))
    sweep_spec = _body_properties(paths.get("/sweeps", {}).get("post", {})).get("spec", {})
    for properties in (jobs, sweep_spec.get("properties", {})):
        notify = properties.get("notify")
        if notify is None:
            continue
        if names:
            notify["items"] = {**notify.get("items", {}), "enum": sorted(names)}
        else:
            notify["maxItems"] = 0
    return bounded


def _body_properties(operation: dict) -> dict:
    body = operation.get("requestBody", {})
    return body.get("content", {}).get(JSON, {}).get("schema", {}).get("properties", {})


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


def _single_host_bounds(paths: dict) -> None:
    """The submission as this server takes it (``supervisor.check_local``): ``nnodes`` at most
    1, ``partition``/``account``/``qos``/``constraint`` only null. Request bodies are inlined
    (``_inline_request_bodies``), so responses keep the generic spec."""
    body = paths.get("/jobs", {}).get("post", {}).get("requestBody", {})
    properties = body.get("content", {}).get(JSON, {}).get("schema", {}).get("properties", {})
    if "nnodes" in properties:
        properties["nnodes"] = {**properties["nnodes"], "maximum": 1}
    for name in SLURM_FIELDS:
        if name in properties:
            kept = {k: v for k, v in properties[name].items() if k not in ("anyOf", "type")}
            properties[name] = {**kept, "type": "null"}


def _inline_request_bodies(schema: dict) -> None:
    """Request bodies spelled inline, with the request-only models they use.

    A generator treats a component as something the server sends: openapi-typescript makes every
    property with a ``default`` required there, so a typed client could not post
    ``{"epochs": 3}``. Inside a request body the same schema means what the server does: a
    defaulted field may be left out. Enums and models that responses share stay components.
    """
    schemas = schema.get("components", {}).get("schemas", {})
    bodies = [
        media for operations in schema.get("paths", {}).values()
        for operation in operations.values()
        for media in operation.get("requestBody", {}).get("content", {}).values()
    ]
    elsewhere = [item for path in schema.get("paths", {}).values() for op in path.values()
                 for key, item in op.items() if key != "requestBody"]
    in_responses = _closure(elsewhere, schemas)
    request_only = {name for name in _closure(bodies, schemas) - in_responses
                    if "properties" in schemas.get(name, {})}

    def inline(node: object) -> object:
        if isinstance(node, dict):
            ref = node.get("$ref", "")
            name = ref.removeprefix("#/components/schemas/")
            if ref.startswith("#/components/schemas/") and name in request_only:
                return inline(schemas[name])
            return {k: inline(v) for k, v in node.items()}
        if isinstance(node, list):
            return [inline(v) for v in node]
        return node

    for media in bodies:
        media["schema"] = inline(media["schema"])
    for name in request_only:
        del schemas[name]


def _closure(node: object, schemas: dict) -> set[str]:
    """Names of the component schemas ``node`` uses, directly or through other ones."""
    found: set[str] = set()
    todo = _refs(node)
    while todo:
        name = todo.pop()
        if name not in found:
            found.add(name)
            todo |= _refs(schemas.get(name, {}))
    return found


def _refs(node: object) -> set[str]:
    """Names of the component schemas ``node`` refers to directly."""
    found: set[str] = set()
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            ref = item.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/components/schemas/"):
                found.add(ref.removeprefix("#/components/schemas/"))
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return found


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
