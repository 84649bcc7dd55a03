"""Carried over from issue 23: ``HEAD`` answers on every ``GET`` route like ``GET`` without the
body, and the served ``/openapi.json`` states this server's own bounds on a submission (the
local executor: ``nnodes`` at most 1, no Slurm fields; the webhook endpoints ``notify`` may
name, as the file names them now: issue 44, item 11) while the checked-in one stays generic."""

import json
import time
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from jsonschema import Draft202012Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from service.app import create_app
from service.settings import Settings
from tests.conftest import LiveServer, hooks
from tools.openapi import checked_in_document
from torchyard_contract.spec import SLURM_FIELDS

API_TOKEN = "head-and-bounds-token-0123456789"
BODY = "/paths/~1jobs/post/requestBody/content/application~1json/schema"


def _same_answer(get: httpx.Response, head: httpx.Response) -> None:
    assert head.status_code == get.status_code, (get.status_code, head.status_code)
    assert head.content == b""
    strip = {"date"}
    assert {k: v for k, v in head.headers.items() if k not in strip} == {
        k: v for k, v in get.headers.items() if k not in strip}


def _same_answer_live(client: httpx.Client, path: str) -> None:
    """As ``_same_answer``, between two GETs that agree (a live job's answer may change)."""
    for _ in range(50):
        before, head, after = client.get(path), client.head(path), client.get(path)
        if before.headers.get("content-length") == after.headers.get("content-length"):
            _same_answer(before, head)
            return
        time.sleep(0.1)
    raise AssertionError(f"GET {path} never answered the same twice")


def test_head_answers_every_get_route_like_get_without_a_body(api: TestClient) -> None:
    job_id = api.post("/jobs", json={"dataset": "synthetic", "epochs": 1}).json()["id"]
    for path in ("/jobs", f"/jobs/{job_id}", "/jobs?limit=1", f"/jobs/{job_id}/metrics",
                 f"/jobs/{job_id}/attempts", "/resources", "/jobs/999999", "/jobs?limit=0"):
        _same_answer(api.get(path), api.head(path))
    assert api.head("/jobs").headers["content-length"] == str(len(api.get("/jobs").content))
    # A path that only takes POST: 405 for HEAD as for GET, and Allow lists HEAD where GET is.
    assert api.head(f"/jobs/{job_id}/cancel").status_code == 405
    allow = api.request("DELETE", "/jobs").headers["allow"]
    assert allow == "GET, HEAD, POST", allow


def test_head_is_checked_like_get_and_never_waits_for_a_stream(
    shared_script_server: LiveServer,
) -> None:
    server = shared_script_server  # for its API tokens
    log_start = server.log.stat().st_size  # the server is shared: this test's part of its log
    with httpx.Client(base_url=server.url, timeout=10) as anonymous:
        _same_answer(anonymous.get("/jobs"), anonymous.head("/jobs"))  # 401 both
        assert anonymous.head("/jobs").status_code == 401
        assert anonymous.head("/healthz").status_code == 200
    with server.client() as c:
        done = c.post("/jobs", json={"dataset": "synthetic", "epochs": 1}).json()["id"]
        c.post(f"/jobs/{done}/cancel")
        for path in ("/jobs", f"/jobs/{done}"):
            _same_answer_live(c, path)
        # The event stream of a live job does not end by itself; its HEAD answers at once.
        live = c.post("/jobs", json={"dataset": "synthetic", "epochs": 50,
                                     "labels": hooks(epoch_sleep_s=2)}).json()["id"]
        started = time.monotonic()
        head = c.head(f"/jobs/{live}/events")
        assert head.status_code == 200 and head.content == b""
        assert head.headers["content-type"].startswith("text/event-stream")
        assert time.monotonic() - started < 5
        assert c.get("/healthz").status_code == 200  # the server is fine afterwards
        c.post(f"/jobs/{live}/cancel")
    assert b"Exception in ASGI application" not in server.log.read_bytes()[log_start:]


def _validator(document: dict) -> Draft202012Validator:
    registry = Registry().with_resource("urn:torchyard", Resource(document, DRAFT202012))
    return Draft202012Validator({"$ref": f"urn:torchyard#{BODY}"}, registry=registry)


def test_the_served_document_states_the_local_executors_bounds(api: TestClient) -> None:
    served = api.get("/openapi.json").json()
    properties = served["paths"]["/jobs"]["post"]["requestBody"]["content"]["application/json"][
        "schema"]["properties"]
    assert properties["nnodes"]["maximum"] == 1 and properties["nnodes"]["minimum"] == 1
    for name in SLURM_FIELDS:
        assert properties[name]["type"] == "null" and "anyOf" not in properties[name], name
    # What the document admits the server takes, and what it refuses the document refuses.
    valid = _validator(served)
    for body in ({"nnodes": 71}, {"nnodes": 2}, {"partition": "gpu"}):
        assert list(valid.iter_errors(body)), body
        assert api.post("/jobs", json=body).status_code == 422, body
    assert not list(valid.iter_errors({"nnodes": 1, "partition": None}))
    assert api.post("/jobs", json={"nnodes": 1, "partition": None}).status_code == 201
    # The checked-in document stays generic.
    generic = json.loads(checked_in_document())
    generic_props = generic["paths"]["/jobs"]["post"]["requestBody"]["content"][
        "application/json"]["schema"]["properties"]
    assert generic_props["nnodes"]["maximum"] == 1024
    assert "anyOf" in generic_props["partition"]


def _notify(document: dict, path: str = "/jobs") -> dict:
    """``notify`` of a submission: ``POST /jobs``'s, or (``/sweeps``) a sweep's base spec's."""
    properties = document["paths"][path]["post"]["requestBody"]["content"]["application/json"][
        "schema"]["properties"]
    return properties["notify"] if path == "/jobs" else properties["spec"]["properties"]["notify"]


SECRET = "whsec_aGVhZC1hbmQtYm91bmRzLXdlYmhvb2tz"


def test_the_served_document_names_the_webhook_endpoints_as_the_file_does_now(
    tmp_path: Path,
) -> None:
    """What schemathesis found: with no endpoints a schema-valid ``"notify": ["EUE"]`` was a 422.
    The served document admits exactly the names the server takes, following an edited file
    without a restart; the checked-in one keeps the generic list."""
    def valid(document: dict, body: dict) -> bool:
        return not list(_validator(document).iter_errors(body))

    without = create_app(Settings(home=tmp_path / "a", gpus="none", cpu_slots=1),
                         run_supervisor=False)
    with TestClient(without) as client:
        served = client.get("/openapi.json").json()
        assert _notify(served)["maxItems"] == 0
        assert not valid(served, {"notify": ["EUE"]})
        assert client.post("/jobs", json={"notify": ["EUE"]}).status_code == 422
        assert valid(served, {"notify": []})
        assert client.post("/jobs", json={"notify": []}).status_code == 201
        # A sweep's base spec takes the same front door (issue 44, item 10).
        assert _notify(served, "/sweeps")["maxItems"] == 0
        sweep = {"spec": {"notify": ["EUE"]}, "space": {"lr": {"type": "choice", "values": [0.1]}}}
        assert client.post("/sweeps", json=sweep).status_code == 422

    hooks_file = tmp_path / "webhooks.json"
    hooks_file.write_text(json.dumps({n: {"url": "http://127.0.0.1:9/h", "secret": SECRET}
                                      for n in ("ci", "chat")}))
    configured = create_app(Settings(home=tmp_path / "b", gpus="none", cpu_slots=1,
                                     webhooks_file=hooks_file), run_supervisor=False)
    with TestClient(configured) as client:
        served = client.get("/openapi.json").json()
        assert _notify(served)["items"]["enum"] == ["chat", "ci"]
        assert _notify(served)["maxItems"] == _notify(json.loads(checked_in_document()))["maxItems"]
        for names, status in ((["EUE"], 422), (["ci", "chat"], 201)):
            assert valid(served, {"notify": names}) == (status == 201), names
            assert client.post("/jobs", json={"notify": names}).status_code == status, names
        # Edited while the server runs: the next submission and the next document agree.
        hooks_file.write_text(json.dumps({"ops": {"url": "http://127.0.0.1:9/h", "secret": SECRET}}))
        served = client.get("/openapi.json").json()
        assert _notify(served)["items"]["enum"] == ["ops"]
        for names, status in ((["ci"], 422), (["ops"], 201)):
            assert valid(served, {"notify": names}) == (status == 201), names
            assert client.post("/jobs", json={"notify": names}).status_code == status, names
        hooks_file.write_text("{not json")  # unusable: every name is refused, none admitted
        served = client.get("/openapi.json").json()
        assert _notify(served)["maxItems"] == 0 and "enum" not in _notify(served)["items"]
        assert client.post("/jobs", json={"notify": ["ops"]}).status_code == 422
        assert client.get("/openapi.json").json() == configured.openapi()

    generic = _notify(json.loads(checked_in_document()))
    assert "enum" not in generic["items"] and generic["maxItems"] > 0


@pytest.mark.parametrize("executor", ["slurm"])
def test_a_slurm_server_serves_the_generic_document(tmp_path: Path, executor: str) -> None:
    """But for the webhook endpoints, which every server states (none here)."""
    settings = Settings(home=tmp_path / "home", gpus="none", cpu_slots=1, executor=executor,
                        api_tokens=API_TOKEN)
    app = create_app(settings, run_supervisor=False)
    with TestClient(app, headers={"Authorization": f"Bearer {API_TOKEN}"}) as client:
        served = client.get("/openapi.json").json()
    generic = json.loads(checked_in_document())
    for path in ("/jobs", "/sweeps"):
        assert _notify(served, path) == {**_notify(generic, path), "maxItems": 0}
        _notify(served, path)["maxItems"] = _notify(generic, path)["maxItems"]
    assert served == generic
