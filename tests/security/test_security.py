"""Security: tokens (API and per-job), the auth matrix over every route, input limits, paths, bind.

The auth matrix is generated from ``app.routes`` and runs against a real uvicorn server (streams
such as SSE are opened and closed after the status line), so a route added later is covered.
"""

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import fastapi.routing
import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from starlette.routing import Mount, Route

from service.api import authz
from service.api.middleware.auth import is_public, worker_job_id
from service.app import create_app
from service.domain.intake.admission import AdmissionRefused, require_tokens_for_scripts
from service.settings import Settings
from service.settings.tokens import new_token
from service.store import repository as repo
from tests.conftest import LOOPBACK_TLS, REPO_ROOT, LiveServer, both_stores, free_port
from tests.security.people import ThreadServer, serve_in_thread
from torchyard_contract.childenv import environ_for_children
from torchyard_contract.spec import JobSpec
from torchyard_contract.state import JobState

API_TOKEN = "api-token-for-tests-0123456789"
BEARER = {"authorization": f"Bearer {API_TOKEN}"}
DIGITS = {"name": "sec", "dataset": "digits", "epochs": 1, "nproc_per_node": 1}


def _settings(tmp_path: Path, **overrides: object) -> Settings:
    base: dict[str, object] = {"home": tmp_path / "home", "cpu_slots": 4, "gpus": "none"}
    return Settings(**{**base, **overrides})


def _launch(app: FastAPI, job_id: int) -> str:
    """Put a queued job where a launched one is (starting, with a token), as the supervisor does."""
    token, digest = new_token()
    with app.state.session_factory() as session:
        assert repo.transition(session, job_id, JobState.starting, token_hash=digest)
        session.commit()
    return token


def _end(app: FastAPI, job_id: int, ago_s: float) -> None:
    with app.state.session_factory() as session:
        ended = repo.utcnow() - timedelta(seconds=ago_s)
        assert repo.transition(session, job_id, JobState.succeeded, ended_at=ended)
        session.commit()


@pytest.fixture
def secured(tmp_path: Path, database_url: str | None) -> Iterator[TestClient]:
    settings = _settings(tmp_path, api_tokens=API_TOKEN, database_url=database_url)
    app = create_app(settings, run_supervisor=False)
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client


# --- the auth matrix, against a real uvicorn server ----------------------------------------------

def _operations(app: FastAPI) -> list[tuple[str, str]]:
    """(method, path template) for every route and mount of the app, as it is now."""
    # FastAPI >= 0.16x keeps included routers lazily; iter_route_contexts flattens them.
    flatten = getattr(fastapi.routing, "iter_route_contexts", None)
    ops: set[tuple[str, str]] = set()
    for item in flatten(app.routes) if flatten else app.routes:
        original = getattr(item, "original_route", item)
        if isinstance(original, Mount):
            ops.add(("GET", item.path.rstrip("/") + "/x"))
        elif isinstance(original, Route):  # APIRoute is a Route; so are /openapi.json and /docs
            ops.update((m, item.path) for m in (item.methods or {"GET"}) if m != "HEAD")
    return sorted(ops)


def _fill(template: str, job_id: int) -> str:
    return re.sub(r"\{[^}]+\}", lambda m: str(job_id) if m[0] == "{job_id}" else "0", template)


def _status(client: httpx.Client, method: str, path: str, token: str | None, body: dict) -> int:
    headers = {"authorization": f"Bearer {token}"} if token else {}
    kwargs = {"json": body} if method in ("POST", "PUT", "PATCH") else {}
    with client.stream(method, path, headers=headers, **kwargs) as response:  # SSE: status only
        return response.status_code


def _matrix(server: ThreadServer, api_tokens: bool) -> list[str]:
    """Every operation × {none, wrong, other job's token, job token, API token}; the failures."""
    app = server.app
    with httpx.Client(base_url=server.url, timeout=10, headers=BEARER) as c:
        job_id, other_id = (c.post("/jobs", json=DIGITS).json()["id"] for _ in range(2))
    job_token, other_token = _launch(app, job_id), _launch(app, other_id)
    tokens = {"none": None, "wrong": "not-a-token-of-this-server-xyz", "other_job": other_token,
              "job": job_token, "api": API_TOKEN}
    ops = _operations(app)
    assert ("POST", "/jobs/{job_id}/records") in ops and ("GET", "/jobs/{job_id}") in ops
    failures = []
    with httpx.Client(base_url=server.url, timeout=10) as client:
        for method, template in ops:
            path = _fill(template, job_id)
            if template.endswith("/wait"):
                path += "?timeout=0"  # a long poll answers only when it ends
            worker = worker_job_id(method, path) is not None
            body = {"records": []} if worker else {}
            for who, token in tokens.items():
                if who == "api" and (method, template) == ("POST", "/jobs/{job_id}/cancel"):
                    continue  # cancelling the job would only test the grace window
                got = _status(client, method, path, token, body)
                if worker:
                    ok = got == {"job": 200, "none": 401}.get(who, 403)
                elif is_public(template):
                    ok = got not in (401, 403)
                elif not api_tokens and (method, template) == ("POST", "/packages"):
                    ok = got == 403  # uploads are code: refused without API tokens
                elif not api_tokens:
                    ok = got not in (401, 403)  # open API (loopback only, see serve)
                elif who == "api":
                    ok = got not in (401, 403)
                elif who in ("job", "other_job"):
                    ok = got == 403
                else:
                    ok = got == 401
                if not ok or got >= 500:
                    failures.append(f"{method} {template} with {who} token: {got}")
    return failures


@both_stores
def test_auth_matrix_with_api_tokens(tmp_path: Path, database_url: str | None) -> None:
    settings = _settings(tmp_path, api_tokens=API_TOKEN, database_url=database_url)
    app = create_app(settings, run_supervisor=False)
    with serve_in_thread(app) as server:
        assert _matrix(server, api_tokens=True) == []


def test_auth_matrix_without_api_tokens(tmp_path: Path) -> None:
    app = create_app(_settings(tmp_path), run_supervisor=False)
    with serve_in_thread(app) as server:
        assert _matrix(server, api_tokens=False) == []


# --- API tokens ------------------------------------------------------------------------------------

def test_401_names_the_scheme_and_keeps_the_error_shape(secured: TestClient) -> None:
    r = secured.get("/jobs")
    assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer")
    assert set(r.json()) == {"error", "message", "details"}
    wrong = secured.get("/jobs", headers={"authorization": "Bearer nope"})
    assert wrong.status_code == 401 and 'error="invalid_token"' in wrong.headers["www-authenticate"]
    assert secured.get("/jobs", headers={"authorization": f"Basic {API_TOKEN}"}).status_code == 401
    assert secured.get("/healthz").status_code == 200
    assert secured.get("/jobs", headers=BEARER).status_code == 200


def test_only_digests_are_kept(tmp_path: Path) -> None:
    settings = _settings(tmp_path, api_tokens=f"{API_TOKEN}, second-token-abcdefghij")
    assert API_TOKEN not in repr(settings) and API_TOKEN not in str(settings.api_tokens)
    assert len(settings.api_token_digests()) == 2
    with pytest.raises(ValueError, match="at least 16"):
        _settings(tmp_path, api_tokens="short")


def test_tokens_file(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text(f"# operators\n{API_TOKEN}\n\nsecond-token-abcdefghij\n")
    app = create_app(_settings(tmp_path, api_tokens_file=path), run_supervisor=False)
    with TestClient(app) as c:
        assert c.get("/jobs", headers=BEARER).status_code == 200
        assert c.get("/jobs", headers={"authorization": "Bearer second-token-abcdefghij"}
                     ).status_code == 200
        assert c.get("/jobs").status_code == 401
    path.write_text("# nothing\n")
    with pytest.raises(ValueError, match="holds no tokens"):  # fail closed, never open
        create_app(_settings(tmp_path, api_tokens_file=path), run_supervisor=False)
    with pytest.raises(ValueError, match="cannot read"):
        create_app(_settings(tmp_path, api_tokens_file=tmp_path / "missing"), run_supervisor=False)


# --- job tokens ------------------------------------------------------------------------------------

REC = {"records": [{"rank": 0, "epoch": 1, "name": "loss", "value": 1.0, "time": 1.0}]}


@both_stores
def test_job_token_is_for_its_own_job_only(secured: TestClient) -> None:
    a, b = (secured.post("/jobs", json=DIGITS, headers=BEARER).json()["id"] for _ in range(2))
    token_a, token_b = _launch(secured.app, a), _launch(secured.app, b)
    as_a = {"authorization": f"Bearer {token_a}"}
    assert secured.post(f"/jobs/{a}/records", json=REC, headers=as_a).status_code == 200
    refused = secured.post(f"/jobs/{b}/records", json=REC, headers=as_a)
    assert refused.status_code == 403 and refused.json()["error"] == "forbidden"
    # no reading, submitting or cancelling with a job token, not even its own job
    assert secured.get(f"/jobs/{a}", headers=as_a).status_code == 403
    assert secured.get(f"/jobs/{a}/metrics", headers=as_a).status_code == 403
    assert secured.post("/jobs", json=DIGITS, headers=as_a).status_code == 403
    assert secured.post(f"/jobs/{a}/cancel", headers=as_a).status_code == 403
    # an API token does not write metrics: they come only from the job's ranks
    assert secured.post(f"/jobs/{b}/records", json=REC, headers=BEARER).status_code == 403
    assert secured.get(f"/jobs/{b}", headers=BEARER).json()["state"] == "starting"
    assert token_b != token_a


@both_stores
def test_job_token_expires_after_the_grace(tmp_path: Path, database_url: str | None) -> None:
    settings = _settings(tmp_path, worker_token_grace_s=30, database_url=database_url)
    app = create_app(settings, run_supervisor=False)
    with TestClient(app) as c:
        recent, old = (c.post("/jobs", json=DIGITS).json()["id"] for _ in range(2))
        tokens = {j: _launch(app, j) for j in (recent, old)}
        _end(app, recent, ago_s=5)
        _end(app, old, ago_s=31)
        # Within the grace the token is still known, but an ended job stores nothing more: 409
        # says why (docs/metrics.md), where an expired token gets 403.
        within = c.post(f"/jobs/{recent}/records", json=REC,
                        headers={"authorization": f"Bearer {tokens[recent]}"})
        assert within.status_code == 409 and "is over" in within.json()["message"]
        late = c.post(f"/jobs/{old}/records", json=REC,
                      headers={"authorization": f"Bearer {tokens[old]}"})
        assert late.status_code == 403 and "expired" in late.json()["message"]
        queued = c.post("/jobs", json=DIGITS).json()["id"]  # not launched: no token exists
        assert c.post(f"/jobs/{queued}/records", json=REC,
                      headers={"authorization": f"Bearer {tokens[recent]}"}).status_code == 403


def test_server_secrets_are_not_inherited_by_jobs() -> None:
    env = environ_for_children({"TORCHYARD_API_TOKENS": API_TOKEN, "TORCHYARD_API_TOKENS_FILE": "f",
                                "TORCHYARD_TEST_FAIL_RANK": "1", "PATH": "/bin"})
    assert env == {"TORCHYARD_TEST_FAIL_RANK": "1", "PATH": "/bin"}


def test_warm_settings_stay_with_the_server_and_only_the_handoff_passes() -> None:
    from service.run.warm import COLD_ENV, SOCKET_ENV

    env = environ_for_children({"TORCHYARD_WARM_RANKS": "true", "TORCHYARD_WARM_POOL_SIZE": "3",
                                SOCKET_ENV: "/s.sock", COLD_ENV: "why"})
    assert env == {SOCKET_ENV: "/s.sock", COLD_ENV: "why"}


def test_script_jobs_need_api_tokens(tmp_path: Path) -> None:
    script = JobSpec(entrypoint="train.py")
    with pytest.raises(AdmissionRefused, match="TORCHYARD_API_TOKENS"):
        require_tokens_for_scripts(script, _settings(tmp_path))
    require_tokens_for_scripts(script, _settings(tmp_path, api_tokens=API_TOKEN))
    require_tokens_for_scripts(JobSpec(), _settings(tmp_path))  # built-in trainer: fine


def test_script_job_without_tokens_is_403(api: TestClient, tmp_path: Path) -> None:
    r = api.post("/jobs", json={"entrypoint": "train.py"})
    assert r.status_code == 403 and "TORCHYARD_API_TOKENS" in r.json()["message"]


# --- input -----------------------------------------------------------------------------------------

def test_oversized_body_is_413(tmp_path: Path) -> None:
    app = create_app(_settings(tmp_path, max_body_bytes=64 * 1024), run_supervisor=False)
    big = b'{"records": [' + b" " * 70_000 + b"]}"
    with TestClient(app) as c:
        r = c.post("/jobs", content=big, headers={"content-type": "application/json"})
        assert r.status_code == 413 and r.json()["error"] == "payload_too_large"
        # auth comes first: a stranger's big upload is refused without reading it
        assert c.post("/jobs/1/records", content=big).status_code == 401

        def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it streams
            yield b'{"name": "x'
            for _ in range(20):
                yield b"x" * 4096

        r = c.post("/jobs", content=chunks(), headers={"content-type": "application/json"})
        assert r.status_code == 413
        small = c.post("/jobs", content=iter([json.dumps(DIGITS).encode()]),
                       headers={"content-type": "application/json"})
        assert small.status_code == 201  # a chunked body under the limit still works


def test_oversized_body_on_a_real_server_is_413_before_it_is_read(
    live_server_factory, tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    # No job runs here: no warm pool to start.
    server: LiveServer = live_server_factory(TORCHYARD_MAX_BODY_BYTES="100000",
                                             TORCHYARD_WARM_RANKS="false")
    started = time.monotonic()
    r = httpx.post(f"{server.url}/jobs", content=b"x" * 2_000_000,
                   headers={"content-type": "application/json"}, timeout=10)
    assert r.status_code == 413 and time.monotonic() - started < 5


def test_nested_or_huge_json_is_a_fast_4xx(api: TestClient) -> None:
    for body in (b"[" * 200_000 + b"]" * 200_000,
                 b'{"a":' * 100_000 + b"1" + b"}" * 100_000,
                 json.dumps({**DIGITS, "labels": {f"k{i}": "v" for i in range(50_000)}}).encode()):
        started = time.monotonic()
        r = api.post("/jobs", content=body, headers={"content-type": "application/json"})
        assert 400 <= r.status_code < 500 and time.monotonic() - started < 3, r.status_code
        assert set(r.json()) == {"error", "message", "details"}


@pytest.mark.parametrize("bad", [
    b'{"lr": NaN}', b'{"lr": Infinity}', b'{"max_runtime_s": -Infinity}', b'{"epochs": 1e400}',
    b'{"name": "a\\u0000b"}', b'{"dataset_root": "/tmp/\\u0000"}', b'{"labels": {"k": "\\u0000"}}',
    b'{"labels": {"../k": "v"}}', b'{"name": "a;rm -rf /"}', b'{"name": "$(id)"}',
    b'{"seed": -1}', b'{"nproc_per_node": 99999999999999999999999}', b'{"priority": 1e300}',
    b'{"dataset": "imagenet"}', b'{"resume_from": 9999999999999999999999}', b'[]', b'null',
])
def test_bad_specs_are_4xx(api: TestClient, bad: bytes) -> None:
    r = api.post("/jobs", content=bad, headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text
    assert "Traceback" not in r.text


@pytest.mark.parametrize("query", [
    "limit=999999999999999999999", "limit=-1", "rank=-1", "after=1e3", "after=NaN",
    "name=%00", "rank=99999999999", "colour=red",
])
def test_bad_metric_queries_are_422(api: TestClient, query: str) -> None:
    job_id = api.post("/jobs", json=DIGITS).json()["id"]
    r = api.get(f"/jobs/{job_id}/metrics?{query}")
    assert r.status_code == 422 or (query == "name=%00" and r.status_code == 200), r.text


def test_unknown_query_params_and_enum_choices(api: TestClient) -> None:
    r = api.get("/jobs?colour=red&limit=5")
    assert r.status_code == 422
    assert r.json()["details"] == [{"field": "colour", "message": "unknown field"}]
    r = api.get("/jobs?state=nope")
    assert r.status_code == 422 and "queued" in r.text and "cancelled" in r.text


def test_huge_or_negative_ids_and_ranks_are_4xx(api: TestClient) -> None:
    for path in ("/jobs/99999999999999999999999", "/jobs/-1", "/jobs/1e3",
                 "/jobs/99999999999999999999/metrics"):
        r = api.get(path)
        assert 400 <= r.status_code < 500, (path, r.status_code)
    r = api.post("/jobs/99999999999999999999/records", json=REC, headers=BEARER)
    assert r.status_code == 403
    job_id = api.post("/jobs", json=DIGITS).json()["id"]
    token = _launch(api.app, job_id)
    bad = {"records": [{**REC["records"][0], "rank": -1}]}
    r = api.post(f"/jobs/{job_id}/records", json=bad, headers={"authorization": f"Bearer {token}"})
    assert r.status_code == 422 and r.json()["details"][0]["field"].endswith("rank")


def test_unexpected_errors_carry_no_traceback(
    api: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    def boom() -> None:
        raise RuntimeError("secret internals /etc/passwd")

    api.app.add_api_route("/boom", boom)
    assert api.get("/boom").status_code == 403  # a route without an authorization rule
    monkeypatch.setitem(authz.RULES, ("GET", "/boom"), authz.Rule.signed_in)
    r = api.get("/boom")
    assert r.status_code == 500
    assert r.json() == {"error": "internal", "message": "internal server error", "details": []}


# --- paths -----------------------------------------------------------------------------------------

def test_dataset_root_is_confined_to_the_data_dirs(tmp_path: Path) -> None:
    data, outside = tmp_path / "data", tmp_path / "outside"
    (data / "mnist").mkdir(parents=True)
    outside.mkdir()
    (data / "escape").symlink_to(outside)
    app = create_app(_settings(tmp_path, data_dirs=str(data)), run_supervisor=False)
    with TestClient(app) as c:
        for bad in ("../outside", str(data / ".." / "outside"), "/etc", str(outside),
                    "escape", str(data / "escape" / "x"), "mnist/../../outside"):
            r = c.post("/jobs", json={**DIGITS, "dataset_root": bad})
            assert r.status_code == 422, (bad, r.text)
            assert r.json()["details"][0]["field"] == "dataset_root", r.text
        inside = c.post("/jobs", json={**DIGITS, "dataset_root": "mnist"})
        assert inside.status_code == 201, inside.text
        assert inside.json()["spec"]["dataset_root"] == str((data / "mnist").resolve())
        absolute = c.post("/jobs", json={**DIGITS, "dataset_root": str(data / "new")})
        assert absolute.status_code == 201  # missing but inside: the job fails naming it


def test_default_data_dir_is_under_home(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    assert settings.data_roots == [tmp_path / "home" / "data"]


def test_nothing_from_a_spec_reaches_a_shell() -> None:
    """Processes are started from argv lists only; names and labels never become paths."""
    sources = list((REPO_ROOT / "service").rglob("*.py")) + list((REPO_ROOT / "worker").rglob("*.py"))
    shell = re.compile(r"shell\s*=\s*True|os\.system\(|os\.popen\(|create_subprocess_shell")
    offenders = [str(p) for p in sources if shell.search(p.read_text())]
    assert offenders == []
    uses_name = re.compile(r"spec\.(name|labels)\b[^\n]*(/|Path\(|open\()")
    assert [str(p) for p in sources if uses_name.search(p.read_text())] == []


# --- CORS ------------------------------------------------------------------------------------------

def test_cors_is_off_by_default_and_configurable(tmp_path: Path) -> None:
    origin = "https://dash.example"
    closed = create_app(_settings(tmp_path), run_supervisor=False)
    with TestClient(closed) as c:
        r = c.get("/healthz", headers={"origin": origin})
        assert "access-control-allow-origin" not in r.headers
    opened = create_app(_settings(tmp_path, cors_origins=origin, api_tokens=API_TOKEN),
                        run_supervisor=False)
    with TestClient(opened) as c:
        pre = c.options("/jobs", headers={"origin": origin, "access-control-request-method": "GET",
                                          "access-control-request-headers": "authorization"})
        assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == origin
        r = c.get("/jobs", headers={"origin": origin, **BEARER})
        assert r.headers["access-control-allow-origin"] == origin
        other = c.get("/jobs", headers={"origin": "https://evil.example", **BEARER})
        assert "access-control-allow-origin" not in other.headers


# --- serve -----------------------------------------------------------------------------------------

def _serve_cli(tmp_path: Path, *args: str, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "service", "serve", *args],
        env={**os.environ, "TORCHYARD_HOME": str(tmp_path / "home"), "TORCHYARD_GPUS": "none",
             **env},
        cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )


def test_serve_refuses_a_public_bind_without_tokens(tmp_path: Path) -> None:
    env = {k: "" for k in ("TORCHYARD_API_TOKENS",)}
    proc = _serve_cli(tmp_path, "--host", "0.0.0.0", "--port", str(free_port()), **env)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2, out
    assert "refusing to bind '0.0.0.0' without API tokens" in out
    assert "TORCHYARD_API_TOKENS" in out and "--insecure" in out


@pytest.mark.parametrize("how", ["insecure", "tokens"])
def test_serve_binds_public_with_insecure_or_tokens(tmp_path: Path, how: str) -> None:
    port = free_port()
    args = ["--insecure"] if how == "insecure" else []
    env = {"TORCHYARD_API_TOKENS": API_TOKEN} if how == "tokens" else {}
    proc = _serve_cli(tmp_path, "--host", "0.0.0.0", "--port", str(port), *args, **env)
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, proc.communicate()[0]
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1,
                             verify=LOOPBACK_TLS).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline
            time.sleep(0.1)
        expected = 200 if how == "insecure" else 401
        assert httpx.get(f"http://127.0.0.1:{port}/jobs", timeout=5).status_code == expected
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=15)
    assert ("WARNING" in out) == (how == "insecure")
    assert API_TOKEN not in out


# --- end to end: ranks post with their job token while API tokens are on; nothing logs a token -----

def test_real_job_with_api_tokens_and_no_token_in_any_log(shared_script_server: LiveServer) -> None:
    """On the shared script server (API tokens on): its log holds every test's requests so far,
    and none of them may show a token."""
    server, token = shared_script_server, shared_script_server.token
    assert token
    with server.client() as c:
        assert httpx.get(f"{server.url}/jobs/1", timeout=5).status_code == 401
        job_id = c.post("/jobs", json={**DIGITS, "epochs": 2}).json()["id"]
        job = server.wait_for(job_id, {"succeeded", "failed"})
        assert job["state"] == "succeeded", job["reason"]
        losses = c.get(f"/jobs/{job_id}/metrics", params={"name": "loss"}).json()["items"]
    assert [i["epoch"] for i in losses] == [1, 2]
    # The job's own logs (other tests' scripts may print anything) and the server's.
    logs = [server.log, *(server.home / "runs" / str(job_id)).rglob("*.log")]
    assert len(logs) > 2
    for log in logs:
        text = log.read_text(errors="replace")
        assert token not in text and "Bearer" not in text, log
    assert f"POST /jobs/{job_id}/records" in server.log.read_text()  # the ranks posted, over HTTP
