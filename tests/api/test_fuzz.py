"""Fuzzing: schemathesis against the app's own OpenAPI document, every operation, with all checks.

* ``test_every_operation``: in-process (ASGI). Each generated case is sent without a token, with
  the API token, and (the ranks' route) with a live job's own token on that job. Every check runs,
  ``positive_data_acceptance`` and ``negative_data_rejection`` included: what the schema admits is
  accepted, what it refuses is refused, responses conform (status, content type, body, headers),
  nothing is a 5xx.
* ``test_stateful_*``: the stateful phase, which follows the document's OpenAPI links (a submitted
  job's ``id`` into every ``/jobs/{job_id}`` operation), in-process and against a real
  ``torchyard serve`` on a port.

A request the schema admits may still be refused because of this server's state or settings; the
document says so in the operation's responses (:data:`STATE_DEPENDENT`), and only those refusals
count as accepted. ``FUZZ_EXAMPLES`` (default 10) bounds the generated examples per operation
(on top of schemathesis's coverage phase: every bound of every field, most of the ~3,300 cases)
and ``FUZZ_STATEFUL_EXAMPLES`` (default 10) the stateful scenarios; the case count is printed.
Deeper runs raise them (``FUZZ_EXAMPLES=100``); the defaults keep the suite's CPU in bounds.
The server keeps its state between scenarios (jobs, idempotency keys), so a scenario hypothesis
draws again can follow other links; past ~30 scenarios hypothesis may stop with
``FlakyStrategyDefinition`` (its consistency check), which is not a finding about the server.
"""

import os
from collections import Counter
from collections.abc import Iterator
from fnmatch import fnmatchcase

import httpx
import pytest
import schemathesis
from fastapi import FastAPI
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, Phase, settings
from hypothesis.errors import FlakyStrategyDefinition

from service.api.middleware.auth import worker_job_id
from service.app import create_app
from service.settings import Settings
from service.settings.tokens import new_token
from service.store import repository as repo
from tests.conftest import LiveServer, _start_server, _stop_server
from torchyard_contract.state import TERMINAL_STATES, JobState

API_TOKEN = "fuzz-api-token-0123456789abcdef"
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "10"))
STATEFUL_EXAMPLES = int(os.environ.get("FUZZ_STATEFUL_EXAMPLES", "10"))
CASES: Counter[str] = Counter()  # generated cases per operation
REQUESTS: Counter[str] = Counter()  # each case is sent two or three times (see below)
# Checked by _valid_data_accepted instead (it knows the documented state-dependent refusals).
EXCLUDED = [schemathesis.checks.positive_data_acceptance]
# Fields whose valid values this server may still refuse (422) because of its state or settings,
# as POST /jobs documents: ranks that do not fit this host, a dataset_root outside
# TORCHYARD_DATA_DIRS, an entrypoint that is not a file in the script directories, resume_from
# naming no job, secret_env naming a secret the server does not hold, nnodes > 1 or a Slurm
# field on the local executor, a package not uploaded here, notify naming no webhook endpoint,
# mlflow set on a server that exports to no MLflow tracking server;
# and a retry rule's log_pattern that Python's re does not compile (the schema cannot say it).
# Entries are fnmatch patterns.
# A sweep's base spec may be refused for the same reasons, and its space by rules across fields
# the schema cannot state (its description says them): a dimension names a field of the base
# spec, low below high, grid takes choice and int only and at most its size in trials, a
# script's {placeholder} in args names a dimension.
JOB_STATE_DEPENDENT = {"nproc_per_node", "dataset_root", "entrypoint", "resume_from",
                       "secret_env", "nnodes", "partition", "account", "qos", "constraint",
                       "package", "notify", "on_failure.*.log_pattern", "mlflow", "mlflow.*"}
STATE_DEPENDENT = {
    # The served document names this server's webhook endpoints (none: notify is empty).
    "POST /jobs": JOB_STATE_DEPENDENT - {"notify"},
    "POST /sweeps": (JOB_STATE_DEPENDENT - {"notify"})
    | {f"spec.{field}" for field in JOB_STATE_DEPENDENT - {"notify"}}
    | {"space", "space.*", "spec.args.*", "max_trials"},
    # who is who: a Unix user this host may not have; a member or viewer needs a team that
    # exists (POST /teams and POST /users document both)
    "POST /teams": {"unix_user"},
    "PATCH /teams/{name}": {"unix_user"},
    "POST /users": {"team"},
    "PATCH /users/{name}": {"team"},
    # a window whose since is not before its until (a rule across two parameters; their
    # descriptions say it)
    "GET /usage": {"since"},
}
# Statuses an operation documents for a body the schema admits but cannot describe: a package
# is any bytes to the schema (format: binary) and must be a zip or tar.gz archive.
CONTENT_DEPENDENT = {"POST /packages": {415}}
HOSTILE_SETTINGS = {"cpu_slots": 4, "gpus": "none", "api_tokens": API_TOKEN}


@pytest.fixture(scope="module")
def fuzz_app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[FastAPI, int, str]]:
    """The app with API tokens on, migrated, and one launched job (id, job token) to post to."""
    home = tmp_path_factory.mktemp("fuzz") / "home"
    app = create_app(Settings(home=home, **HOSTILE_SETTINGS), run_supervisor=False)
    with TestClient(app) as client:
        job_id = client.post("/jobs", json={}, headers=_bearer(API_TOKEN)).json()["id"]
        token, digest = new_token()
        with app.state.session_factory() as session:
            assert repo.transition(session, job_id, JobState.starting, token_hash=digest)
            session.commit()
        # An event stream ends only once its job is terminal: fuzzed streams are pointed here.
        app.state.fuzz_done_job = client.post("/jobs", json={}, headers=_bearer(API_TOKEN)).json()["id"]
        app.state.supervisor.cancel(app.state.fuzz_done_job)
        yield app, job_id, token


@pytest.fixture(scope="module")
def api_schema(fuzz_app: tuple[FastAPI, int, str]):  # type: ignore[no-untyped-def]
    return schemathesis.openapi.from_asgi("/openapi.json", fuzz_app[0], headers=_bearer(API_TOKEN))


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


def _label(case: schemathesis.Case) -> str:
    return f"{case.operation.method.upper()} {case.operation.path}"


def _valid_data_accepted(case: schemathesis.Case, response) -> None:  # type: ignore[no-untyped-def]
    """schemathesis's positive_data_acceptance, but a 422 naming only fields the operation
    documents as state-dependent counts as accepted."""
    meta = case.meta
    if meta is None or not meta.generation.mode.is_positive or response.status_code < 400:
        return
    if response.status_code in (401, 403, 404, 409):  # credentials, a missing job, its state
        return
    if response.status_code in CONTENT_DEPENDENT.get(_label(case), ()):
        return
    fields = {d.get("field") for d in response.json().get("details", [])}
    if not fields:  # supervisor refusals name their field in the message: "<field>: ..."
        fields = {response.json().get("message", "").partition(":")[0]}
    allowed = STATE_DEPENDENT.get(_label(case), set())
    unexplained = {f for f in fields if not any(fnmatchcase(str(f), a) for a in allowed)}
    assert response.status_code == 422 and not unexplained, (
        f"{_label(case)}: valid data refused with {response.status_code} {response.text[:500]}\n"
        f"{case.as_curl_command()}"
    )


def _negative(case: schemathesis.Case, *locations: str) -> bool:
    """The case was made to violate the schema in one of ``locations`` (path, header...)."""
    components = case.meta.components if case.meta is not None else {}
    return any(loc.value in locations and info.mode.is_negative
               for loc, info in components.items())


def _tame(case: schemathesis.Case) -> None:
    """Long polls answer at once (a fuzzed job never ends on its own)."""
    if case.operation.path.endswith("/wait"):
        timeout = (case.query or {}).get("timeout")
        try:  # the coverage phase also sends it as a string
            valid = timeout is None or 0 < float(timeout) <= 300
        except (TypeError, ValueError):
            valid = False
        if valid:
            case.query = {**(case.query or {}), "timeout": 0}


schema = schemathesis.pytest.from_fixture("api_schema")


@pytest.mark.slow  # ~3,300 cases, ~6,500 requests: about 60-70 s on 2 busy cores
@schema.parametrize()
@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=list(HealthCheck), derandomize=True)
def test_every_operation(case: schemathesis.Case, fuzz_app: tuple[FastAPI, int, str]) -> None:
    app, job_id, job_token = fuzz_app
    op = _label(case)
    _tame(case)
    if op == "GET /jobs/{job_id}/events":
        _end_stream(app, case)
    # No token: 401 everywhere but /healthz. With the API token: the real answers.
    case.call_and_validate(excluded_checks=EXCLUDED)
    _valid_data_accepted(case, case.call_and_validate(excluded_checks=EXCLUDED,
                                                      headers=_bearer(API_TOKEN)))
    CASES[op] += 1
    REQUESTS[op] += 2
    worker = worker_job_id(case.operation.method.upper(), case.operation.path.replace("{job_id}", "1"))
    # The job token call replaces the path and the token: a case made invalid there is not
    # invalid any more, so it is not sent again.
    if worker and not _negative(case, "path", "header"):
        case.path_parameters = {**(case.path_parameters or {}), "job_id": job_id}
        _valid_data_accepted(case, case.call_and_validate(excluded_checks=EXCLUDED,
                                                          headers=_bearer(job_token)))
        REQUESTS[op] += 1


def _end_stream(app: FastAPI, case: schemathesis.Case) -> None:
    """An event stream ends once its job is terminal: a stream on a live job reads a finished
    one instead (the job records are posted to stays live)."""
    job_id = (case.path_parameters or {}).get("job_id")
    if isinstance(job_id, int) and 1 <= job_id < 2**63:
        with app.state.session_factory() as session:
            job = repo.get_job(session, job_id)
        if job is not None and JobState(job.state) not in TERMINAL_STATES:
            case.path_parameters = {**case.path_parameters, "job_id": app.state.fuzz_done_job}


@pytest.mark.slow  # it reads what test_every_operation (slow) fuzzed, so it is selected with it
def test_the_schema_covers_every_operation(api_schema) -> None:  # type: ignore[no-untyped-def]
    """The fuzzer saw every operation (a new route is fuzzed without anyone adding it here)."""
    paths = api_schema.raw_schema["paths"]
    operations = {f"{m.upper()} {p}" for p, ops in paths.items() for m in ops}
    assert {"POST /jobs", "GET /jobs/{job_id}", "POST /jobs/{job_id}/records"} <= operations
    fuzzed = {op for op in CASES if not op.startswith("stateful ")}
    assert fuzzed == operations, operations - fuzzed
    assert all(paths[p][m].get("responses", {}).get("422") is None or
               "ErrorBody" in str(paths[p][m]["responses"]["422"]) for p in paths for m in paths[p])


def _stateful(schema_, cancel) -> None:  # type: ignore[no-untyped-def]
    """Run the stateful phase: sequences along the document's links, every check on each step."""
    base = schema_.as_state_machine()

    class Machine(base):  # type: ignore[misc, valid-type]
        def get_call_kwargs(self, case: schemathesis.Case) -> dict:
            # A case made invalid in its headers (e.g. no Authorization) is sent as made.
            return {} if _negative(case, "header") else {"headers": _bearer(API_TOKEN)}

        def before_call(self, case: schemathesis.Case) -> None:
            _tame(case)
            CASES[f"stateful {_label(case)}"] += 1
            if _label(case) == "GET /jobs/{job_id}/events":
                cancel(case)

        def validate_response(self, response, case, additional_checks=None, **kwargs):  # type: ignore[no-untyped-def]
            # As the base class does (the recorder feeds the stateful checks), minus EXCLUDED.
            case.validate_response(
                response, additional_checks=additional_checks, excluded_checks=EXCLUDED,
                transport_kwargs=kwargs or None, recorder=getattr(self, "recorder", None),
            )
            _valid_data_accepted(case, response)

    # No shrinking and no example database: the server's state moved on since a sequence ran,
    # so replaying it draws different links (hypothesis calls that flaky); the first failure is
    # reported as found, with its curl line.
    try:
        Machine.run(settings=settings(
            max_examples=STATEFUL_EXAMPLES, stateful_step_count=6, deadline=None,
            suppress_health_check=list(HealthCheck), derandomize=True, database=None,
            phases=[Phase.explicit, Phase.generate], report_multiple_bugs=False,
        ))
    except FlakyStrategyDefinition:
        # Hypothesis's own consistency check on how rules were drawn, not a finding about the
        # server: a bundle filled from the live server's answers (its jobs) differs from the one
        # an earlier scenario saw. Every scenario sent before it was checked in full; a failed
        # check raises its own error above, never this one.
        pass
    assert any(k.startswith("stateful GET /jobs/{job_id}") for k in CASES), dict(CASES)


def test_stateful_in_process(api_schema, fuzz_app: tuple[FastAPI, int, str]) -> None:  # type: ignore[no-untyped-def]
    _stateful(api_schema, lambda case: _end_stream(fuzz_app[0], case))


@pytest.fixture(scope="module")
def live_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """``torchyard serve`` with API tokens. Its supervisor runs, but ranks are never started:
    the python that would run torchrun is ``false``, so a fuzzed job fails at launch instead of
    training (the API is under test here, not torchrun)."""
    srv = _start_server(tmp_path_factory.mktemp("fuzz-live") / "home", {
        "TORCHYARD_API_TOKENS": API_TOKEN, "TORCHYARD_PYTHON_EXECUTABLE": "/bin/false",
        "TORCHYARD_WARM_RANKS": "false",  # no job can start here: no pool to wait for
    })
    yield srv
    _stop_server(srv)


def test_stateful_against_the_real_server(live_server: LiveServer) -> None:
    live_schema = schemathesis.openapi.from_url(
        f"{live_server.url}/openapi.json", headers=_bearer(API_TOKEN)
    )

    def cancel(case: schemathesis.Case) -> None:
        job_id = (case.path_parameters or {}).get("job_id")
        if isinstance(job_id, int) and 1 <= job_id < 2**63:
            with live_server.client() as c:
                c.post(f"/jobs/{job_id}/cancel")

    _stateful(live_schema, cancel)
    assert live_server.proc.poll() is None, live_server.log.read_text()[-3000:]
    with httpx.Client(base_url=live_server.url, timeout=10) as c:
        assert c.get("/healthz").status_code == 200
