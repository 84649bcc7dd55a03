"""The OpenAPI document as a generator sees it: valid 3.1, resolvable, honest about request vs
response, exact about bounds, checked in (``docs/openapi.json``), and clients generated from it.

Client generation: ``openapi-python-client`` (the ``test`` extra) and, from ``clients/``
(``npm ci``), ``openapi-typescript`` + ``tsc --strict`` on ``clients/usage.ts``. Without ``npm``
the TypeScript test is skipped, saying why, except under ``CI=true`` where it fails.
"""

import difflib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from jsonschema import Draft202012Validator
from openapi_spec_validator import validate
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from service.app import create_app
from service.settings import Settings
from tests.conftest import REPO_ROOT
from tools.openapi import checked_in_document
from torchyard_contract.spec import SLURM_FIELDS, JobSpec

CHECKED_IN = REPO_ROOT / "docs" / "openapi.json"
CLIENTS = REPO_ROOT / "clients"
REGENERATE = "python -m tools.openapi > docs/openapi.json"
API_TOKEN = "openapi-test-token-0123456789"
README_FIRST_JOB = {"model": "mlp", "dataset": "digits", "epochs": 3, "nproc_per_node": 2}


def _document(tmp_path: Path, **settings: object) -> dict:
    app = create_app(Settings(home=tmp_path / "home", gpus="none", cpu_slots=4, **settings),
                     run_supervisor=False)
    return app.openapi()


@pytest.fixture(scope="module")
def document(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return _document(tmp_path_factory.mktemp("doc"), api_tokens=API_TOKEN)


def _validator(document: dict, pointer: str) -> Draft202012Validator:
    registry = Registry().with_resource("urn:torchyard", Resource(document, DRAFT202012))
    return Draft202012Validator({"$ref": f"urn:torchyard#{pointer}"}, registry=registry)


def _refs(node: object) -> list[str]:
    if isinstance(node, dict):
        own = [node["$ref"]] if isinstance(node.get("$ref"), str) else []
        return own + [r for v in node.values() for r in _refs(v)]
    if isinstance(node, list):
        return [r for v in node for r in _refs(v)]
    return []


@pytest.mark.parametrize("tokens", [True, False], ids=["api-tokens", "open"])
def test_the_document_is_valid_openapi_3_1(tmp_path: Path, tokens: bool) -> None:
    doc = _document(tmp_path, **({"api_tokens": API_TOKEN} if tokens else {}))
    assert doc["openapi"].startswith("3.1.")
    validate(doc)  # openapi-spec-validator: raises with the offending path
    assert "itemSchema" not in json.dumps(doc)  # OpenAPI 3.2, not 3.1


def test_every_ref_points_into_components(document: dict) -> None:
    refs = set(_refs(document))
    assert refs, "no $ref at all"
    schemas = document["components"]["schemas"]
    bad = sorted(r for r in refs if not r.startswith("#/components/schemas/")
                 or r.removeprefix("#/components/schemas/") not in schemas)
    assert bad == [], bad
    assert "$defs" not in json.dumps(document)


def test_requests_leave_defaulted_fields_optional_and_responses_require_them(
    document: dict,
) -> None:
    submit = document["paths"]["/jobs"]["post"]["requestBody"]["content"]["application/json"]
    spec_in = submit["schema"]
    assert "required" not in spec_in  # every field has a server default
    body = "/paths/~1jobs/post/requestBody/content/application~1json/schema"
    assert list(_validator(document, body).iter_errors(README_FIRST_JOB)) == []
    # The cross-field rules are in the schema too: a script job takes no trainer fields.
    assert list(_validator(document, body).iter_errors({"entrypoint": "x.py", "epochs": 2}))
    assert list(_validator(document, body).iter_errors({"backend": "nccl", "device": "cpu"}))
    spec_out = document["components"]["schemas"]["JobSpec-Output"]
    assert {"name", "priority", "labels", "nproc_per_node", "entrypoint"} <= set(
        spec_out["required"])
    assert "epochs" not in spec_out["required"]  # a script job's spec has no trainer fields
    stored = JobSpec.model_validate(README_FIRST_JOB).model_dump(mode="json")
    assert list(_validator(document, "/components/schemas/JobSpec-Output").iter_errors(stored)) == []


def test_every_bound_the_server_enforces_is_in_the_schema(document: dict) -> None:
    paths = document["paths"]

    def param(path: str, method: str, name: str) -> dict:
        (found,) = [p for p in paths[path][method]["parameters"] if p["name"] == name]
        return found["schema"]

    for path, operations in paths.items():
        for method, operation in operations.items():
            for p in operation.get("parameters", []):
                if p["name"] == "job_id" and p["in"] == "path":
                    assert p["schema"]["minimum"] == 1 and p["schema"]["maximum"] == 2**63 - 1, (
                        method, path)
    assert param("/jobs", "get", "label")["items"]["pattern"].startswith("^[A-Za-z0-9]")
    assert param("/jobs/{job_id}/events", "get", "Last-Event-ID")["pattern"]
    assert param("/jobs/{job_id}/logs", "get", "offset")["maximum"] == 2**53
    spec = paths["/jobs"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    props = spec["properties"]
    assert props["entrypoint"]["anyOf"][0]["pattern"].startswith("^(?:/?")
    assert props["labels"]["propertyNames"]["pattern"]
    assert "\\u2028" in props["labels"]["additionalProperties"]["pattern"]
    assert props["env"]["propertyNames"]["pattern"] == "^[A-Za-z_][A-Za-z0-9_]*$"
    assert props["epochs"] == {**props["epochs"], "type": "integer", "minimum": 1,
                               "maximum": 100_000}
    records = paths["/jobs/{job_id}/records"]["post"]["requestBody"]["content"]
    batch = records["application/json"]["schema"]
    assert batch["properties"]["records"]["maxItems"] == 1000
    assert batch["properties"]["records"]["items"]["properties"]["name"]["pattern"]
    for description in ("nproc_per_node", "dataset_root", "entrypoint", "resume_from"):
        assert "422" in props[description]["description"] or "refused" in props[
            description]["description"], description


def test_the_event_stream_is_described_per_event(document: dict) -> None:
    responses = document["paths"]["/jobs/{job_id}/events"]["get"]["responses"]
    assert set(responses["200"]["content"]) == {"text/event-stream"}
    event = responses["200"]["content"]["text/event-stream"]["schema"]
    assert event["properties"]["event"]["enum"] == ["state", "metric"]
    assert set(responses["404"]["content"]) == {"application/json"}  # errors are JSON


def test_the_checked_in_document_is_the_served_one(document: dict) -> None:
    # The checked-in document is generic; a local-executor server's own also states its bounds
    # on a submission (nnodes ≤ 1, no Slurm fields, and as every server the webhook endpoints
    # notify may name, none here: tests/api/test_http_head_and_bounds.py).
    generic = json.loads(checked_in_document())
    own = json.loads(json.dumps(document))
    where = ("paths", "/jobs", "post", "requestBody", "content", "application/json", "schema",
             "properties")
    own_props, generic_props = own, generic
    for key in where:
        own_props, generic_props = own_props[key], generic_props[key]
    assert own_props["nnodes"]["maximum"] == 1 and own_props["notify"]["maxItems"] == 0
    for name in ("nnodes", "notify", *SLURM_FIELDS):
        own_props[name] = generic_props[name]
    # A sweep's base spec takes the same front door: its notify is this server's too.
    sweep = ("paths", "/sweeps", "post", "requestBody", "content", "application/json", "schema",
             "properties", "spec", "properties", "notify")
    own_notify, generic_notify = own, generic
    for key in sweep[:-1]:
        own_notify, generic_notify = own_notify[key], generic_notify[key]
    assert own_notify["notify"]["maxItems"] == 0
    own_notify["notify"] = generic_notify["notify"]
    assert own == generic
    served = checked_in_document()
    checked_in = CHECKED_IN.read_text() if CHECKED_IN.exists() else ""
    if served != checked_in:
        diff = "".join(difflib.unified_diff(
            checked_in.splitlines(keepends=True), served.splitlines(keepends=True),
            "docs/openapi.json (checked in)", "/openapi.json (served)", n=2))
        pytest.fail(f"docs/openapi.json is out of date; review the diff and regenerate it with\n"
                    f"    {REGENERATE}\n\n{diff[:20000]}")


def test_the_served_document_with_a_token(tmp_path: Path) -> None:
    app = create_app(Settings(home=tmp_path / "home", gpus="none", cpu_slots=4,
                              api_tokens=API_TOKEN), run_supervisor=False)
    with TestClient(app) as client:
        assert client.get("/openapi.json").status_code == 401
        r = client.get("/openapi.json", headers={"Authorization": f"Bearer {API_TOKEN}"})
        assert r.status_code == 200 and r.json() == app.openapi()


def test_a_python_client_generates_every_operation(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("post_hooks: []\n")  # no formatter run: only generation is under test
    out = tmp_path / "client"
    proc = _run(
        [sys.executable, "-m", "openapi_python_client", "generate", "--path", str(CHECKED_IN),
         "--output-path", str(out), "--config", str(config), "--meta", "none"],
        timeout=120,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    assert "Warning" not in output and "WARNING" not in output, output
    document = json.loads(CHECKED_IN.read_text())
    # Modules are named by operationId in snake case ("a__b" becomes "a_b").
    operation_ids = {re.sub("_+", "_", op["operationId"]) for ops in document["paths"].values()
                     for op in ops.values()}
    generated = {p.stem for p in (out / "api").rglob("*.py") if p.stem != "__init__"}
    assert operation_ids == generated, operation_ids ^ generated
    models = {p.stem for p in (out / "models").glob("*.py")}
    assert {"job_read", "metrics_page", "submit_job_job_spec"} <= models, models


def _run(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    """Run a generator; the caller asserts on the exit status with the output in the message."""
    return subprocess.run(  # type: ignore[call-overload]
        cmd, check=False, capture_output=True, text=True, **kwargs
    )


def _npm() -> str:
    npm = shutil.which("npm")
    if npm is None:
        if os.environ.get("CI") == "true":
            pytest.fail("npm is missing (CI must have Node.js 20 and npm: see .ci/run)")
        pytest.skip("the TypeScript client test needs Node.js and npm (apt-get install npm)")
    return npm


def test_a_typescript_client_type_checks_strictly(tmp_path: Path) -> None:
    npm = _npm()
    ci = _run([npm, "ci", "--no-audit", "--no-fund"], cwd=CLIENTS, timeout=300)
    assert ci.returncode == 0, ci.stdout + ci.stderr
    bin_dir = CLIENTS / "node_modules" / ".bin"
    types = tmp_path / "torchyard.ts"
    gen = _run([str(bin_dir / "openapi-typescript"), str(CHECKED_IN), "-o", str(types)],
               timeout=120)
    assert gen.returncode == 0, gen.stdout + gen.stderr
    shutil.copy(CLIENTS / "usage.ts", tmp_path / "usage.ts")
    tsc = _run(
        [str(bin_dir / "tsc"), "--strict", "--noEmit", "--target", "es2022", "--module", "esnext",
         "--moduleResolution", "bundler", str(tmp_path / "usage.ts")],
        timeout=120,
    )
    assert tsc.returncode == 0, tsc.stdout + tsc.stderr
