"""A web page in the operator's browser cannot use an open (token-less, loopback) server: DNS
rebinding, cross-site writes and form posts are refused; the dashboard cannot be framed.

Issue 17, finding 4. ``service.api.middleware.browserguard``.
"""

import json
from pathlib import Path

import httpx
from fastapi.testclient import TestClient

from service.app import create_app
from service.settings import Settings
from tests.conftest import LiveServer

SPEC = {"name": "guard", "dataset": "digits", "epochs": 1, "nproc_per_node": 1}
EVIL = "https://evil.example"
REBIND = {"host": "rebind.evil.example:8000"}


def test_a_rebinding_host_name_is_refused_on_a_real_open_server(shared_server: LiveServer) -> None:
    live_server = shared_server
    with httpx.Client(base_url=live_server.url, timeout=10) as c:
        ids_before = [j["id"] for j in c.get("/jobs").json()["items"]]  # other tests' jobs
        listed = c.get("/jobs", headers=REBIND)
        submitted = c.post("/jobs", json=SPEC, headers=REBIND)
        shell = c.get("/", headers=REBIND)
        assert listed.status_code == 403, listed.text
        assert "rebind.evil.example" in listed.json()["message"]
        assert submitted.status_code == 403 and shell.status_code == 403
        ids_after = [j["id"] for j in c.get("/jobs").json()["items"]]
        assert ids_after == ids_before, "the refused POST created nothing"
        # The names a local client uses still work.
        for host in (f"127.0.0.1:{live_server.port}", f"localhost:{live_server.port}",
                     f"[::1]:{live_server.port}"):
            assert c.get("/jobs", headers={"host": host}).status_code == 200, host


def test_a_foreign_origin_cannot_cancel_or_submit(api: TestClient) -> None:
    job_id = api.post("/jobs", json=SPEC).json()["id"]
    form = {"origin": EVIL, "content-type": "application/x-www-form-urlencoded"}
    assert api.post(f"/jobs/{job_id}/cancel", headers=form).status_code == 403
    assert api.post(f"/jobs/{job_id}/cancel", headers={"origin": EVIL}).status_code == 403
    assert api.post(f"/jobs/{job_id}/cancel", headers={"origin": "null"}).status_code == 403
    refused = api.post("/jobs", json=SPEC, headers={"origin": EVIL})
    assert refused.status_code == 403 and "cross-site" in refused.json()["message"]
    assert api.get(f"/jobs/{job_id}").json()["state"] == "queued"
    assert len(api.get("/jobs").json()["items"]) == 1
    # The dashboard's own origin (same scheme and host:port) may.
    same = api.post(f"/jobs/{job_id}/cancel", headers={"origin": "http://testserver"})
    assert same.status_code == 200 and same.json()["state"] == "cancelled"
    # Reads from a foreign origin are not refused here (CORS keeps their answers from the page).
    assert api.get("/jobs", headers={"origin": EVIL}).status_code == 200


def test_bodies_must_be_json(api: TestClient) -> None:
    body = json.dumps(SPEC).encode()
    for media in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; b=x"):
        r = api.post("/jobs", content=body, headers={"content-type": media})
        assert r.status_code == 415, (media, r.text)
        assert r.json()["error"] == "unsupported_media_type"
    no_type = api.post("/jobs", content=body)
    assert no_type.status_code == 415
    job_id = api.post("/jobs", json=SPEC).json()["id"]
    assert api.post("/jobs", content=body,
                    headers={"content-type": "application/json; charset=utf-8"}).status_code == 201
    # A POST without a body needs no content type (the CLI's cancel).
    assert api.post(f"/jobs/{job_id}/cancel").status_code == 200
    assert api.get("/openapi.json").json()["paths"]["/jobs"]["post"]["responses"]["415"]


def test_host_names_are_configurable_and_unchecked_with_tokens(tmp_path: Path) -> None:
    named = Settings(home=tmp_path / "a", gpus="none", cpu_slots=2,
                     allowed_hosts="torchyard.lan", public_url="http://gpu-box.lan:8000")
    with TestClient(create_app(named, run_supervisor=False)) as c:
        assert c.get("/jobs", headers={"host": "torchyard.lan:8000"}).status_code == 200
        assert c.get("/jobs", headers={"host": "gpu-box.lan:8000"}).status_code == 200
        assert c.get("/jobs", headers={"host": "other.lan"}).status_code == 403
    token = "api-token-for-tests-0123456789"
    secured = Settings(home=tmp_path / "b", gpus="none", cpu_slots=2, api_tokens=token)
    with TestClient(create_app(secured, run_supervisor=False)) as c:
        # With tokens a rebinding page has no token to send: the name is not the gate.
        r = c.get("/jobs", headers={**REBIND, "authorization": f"Bearer {token}"})
        assert r.status_code == 200


def test_the_dashboard_cannot_be_framed(api: TestClient) -> None:
    for path in ("/", "/static/app.js"):
        r = api.get(path)
        assert r.status_code == 200
        assert r.headers["x-frame-options"] == "DENY"
        assert "frame-ancestors 'none'" in r.headers["content-security-policy"]
        assert "script-src 'self'" in r.headers["content-security-policy"]
