"""Fuzzing: schemathesis against the app's own OpenAPI schema, every operation, in-process (ASGI).

Each generated case is sent without a token, with the API token, and (worker routes) with a live
job's own token on that job: no 5xx, and every response conforms to the schema (status code,
content type, body, headers). The supervisor loop is off, so fuzzed submissions are only stored.
``FUZZ_EXAMPLES`` (default 25) bounds the examples per operation; the case count is printed.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator

import pytest
import schemathesis
from fastapi import FastAPI
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, settings

from service import repository as repo
from service.api.app import create_app
from service.api.auth import worker_job_id
from service.jobtoken import new_token
from service.settings import Settings
from service.state import JobState

API_TOKEN = "fuzz-api-token-0123456789abcdef"
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "25"))
CASES: Counter[str] = Counter()  # generated cases per operation
REQUESTS: Counter[str] = Counter()  # each case is sent two or three times (see below)
# Responses must conform to the schema and nothing may be a 5xx. Left out: negative_data_rejection
# (pydantic's lax mode takes JSON false as 0, harmless) and positive_data_acceptance (a spec
# valid by the schema is still refused when this host lacks the slots: 422 by design).
EXCLUDED = [
    schemathesis.checks.negative_data_rejection, schemathesis.checks.positive_data_acceptance,
]


@pytest.fixture(scope="module")
def fuzz_app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[FastAPI, int, str]]:
    """The app with API tokens on, migrated, and one launched job (id, job token) to post to."""
    home = tmp_path_factory.mktemp("fuzz") / "home"
    app = create_app(
        Settings(home=home, cpu_slots=4, gpus="none", api_tokens=API_TOKEN), run_supervisor=False
    )
    with TestClient(app) as client:
        job_id = client.post("/jobs", json={}, headers={"Authorization": f"Bearer {API_TOKEN}"}
                             ).json()["id"]
        token, digest = new_token()
        with app.state.session_factory() as session:
            assert repo.transition(session, job_id, JobState.starting, token_hash=digest)
            session.commit()
        yield app, job_id, token


@pytest.fixture(scope="module")
def api_schema(fuzz_app: tuple[FastAPI, int, str]):  # type: ignore[no-untyped-def]
    return schemathesis.openapi.from_asgi(
        "/openapi.json", fuzz_app[0], headers={"Authorization": f"Bearer {API_TOKEN}"}
    )


@pytest.fixture(scope="module", autouse=True)
def _report_count(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    reporter = request.config.pluginmanager.getplugin("terminalreporter")
    line = (f"fuzz: {sum(CASES.values())} cases, {sum(REQUESTS.values())} requests over "
            f"{len(CASES)} operations: {dict(CASES)}")
    capture = request.config.pluginmanager.getplugin("capturemanager")
    if reporter is not None and capture is not None:
        with capture.global_and_fixture_disabled():  # shown even without -s
            reporter.ensure_newline()
            reporter.write_line(line)


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=list(HealthCheck), derandomize=True)
def test_every_operation(case: schemathesis.Case, fuzz_app: tuple[FastAPI, int, str]) -> None:
    _app, job_id, job_token = fuzz_app
    op = f"{case.operation.method.upper()} {case.operation.path}"
    if case.operation.path.endswith("/wait"):
        # A long poll on a job that never ends lasts its whole timeout: keep valid ones at 0.
        timeout = (case.query or {}).get("timeout")
        if timeout is None or (isinstance(timeout, int | float) and 0 < timeout <= 300):
            case.query = {**(case.query or {}), "timeout": 0}
    # No token: 401 everywhere but /healthz. With the API token: the real answers.
    case.call_and_validate(excluded_checks=EXCLUDED)
    case.call_and_validate(excluded_checks=EXCLUDED, headers=_bearer(API_TOKEN))
    CASES[op] += 1
    REQUESTS[op] += 2
    if worker_job_id(case.operation.method.upper(), case.operation.path.replace("{job_id}", "1")):
        case.path_parameters = {**(case.path_parameters or {}), "job_id": job_id}
        case.call_and_validate(excluded_checks=EXCLUDED, headers=_bearer(job_token))
        REQUESTS[op] += 1


def test_the_schema_covers_every_operation(api_schema) -> None:  # type: ignore[no-untyped-def]
    """The fuzzer saw every operation (a new route is fuzzed without anyone adding it here)."""
    paths = api_schema.raw_schema["paths"]
    operations = {f"{m.upper()} {p}" for p, ops in paths.items() for m in ops}
    assert {"POST /jobs", "GET /jobs/{job_id}", "POST /jobs/{job_id}/records"} <= operations
    assert set(CASES) == operations, operations - set(CASES)
    assert all(paths[p][m].get("responses", {}).get("422") is None or
               "ErrorBody" in str(paths[p][m]["responses"]["422"]) for p in paths for m in paths[p])
