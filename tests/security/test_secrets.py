"""``secret_env``: a script job's secrets, named in the spec and resolved on the server from
``TORCHYARD_SECRETS_FILE``, reach the ranks' environment and nothing else — no API answer, no
file of the run directory, no line of the server's log."""

import hashlib
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from service.domain.intake.secretstore import SecretRefused, check_names, resolve
from tests.conftest import REPO_ROOT, LiveServer, _copy_sqlite, _start_server, _stop_server

API_TOKEN = "secret-tests-api-token-0123456789"
SECRET = "hf_s3cr3t-VALUE-0f-th3-t0k3n"  # distinctive: found only where it leaked
OTHER = "wandb-0ther-s3cr3t-never-asked-for"


def _write_secrets(path: Path) -> Path:
    path.write_text(json.dumps({"hf": SECRET, "wandb": OTHER}))
    path.chmod(0o600)
    return path


@pytest.fixture
def secrets_file(tmp_path: Path) -> Path:
    return _write_secrets(tmp_path / "secrets.json")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, _migrated_sqlite: Path) -> Iterator[LiveServer]:
    """One server for the module, with a secrets file and a script directory (a server start
    and its warm pool cost ~5 CPU s)."""
    root = tmp_path_factory.mktemp("secrets")
    scripts = root / "scripts"
    scripts.mkdir()
    shutil.copy(REPO_ROOT / "tests" / "jobs" / "secret.py", scripts / "secret.py")
    _copy_sqlite(_migrated_sqlite, root / "home")
    server = _start_server(root / "home", {
        "TORCHYARD_SCRIPT_DIRS": str(scripts), "TORCHYARD_API_TOKENS": API_TOKEN,
        "TORCHYARD_SECRETS_FILE": str(_write_secrets(root / "secrets.json")),
    })
    yield server
    _stop_server(server)


def test_a_secret_reaches_the_ranks_and_nowhere_else(server: LiveServer) -> None:
    spec = {"entrypoint": "secret.py", "nproc_per_node": 2, "env": {"PLAIN": "shown"},
            "secret_env": {"HF_TOKEN": "hf"}}
    answers: list[str] = []
    with server.client() as c:
        c.headers["Authorization"] = f"Bearer {API_TOKEN}"
        created = c.post("/jobs", json=spec)
        assert created.status_code == 201, created.text
        answers.append(created.text)
        job_id = created.json()["id"]
        job = server.wait_for(job_id, {"succeeded"}, timeout_s=120)
        paths = [f"/jobs/{job_id}", "/jobs", f"/jobs/{job_id}/attempts",
                 f"/jobs/{job_id}/metrics", f"/jobs/{job_id}/metrics/summary",
                 f"/jobs/{job_id}/series", f"/jobs/{job_id}/events", f"/jobs/{job_id}/wait",
                 f"/progress?job_id={job_id}", "/resources", "/metrics", "/openapi.json"]
        for path in paths:
            r = c.get(path)
            assert r.status_code == 200, (path, r.text)
            answers.append(r.text)
        logs = {}
        for rank in (0, 1):
            for stream in ("combined", "stdout", "stderr"):
                r = c.get(f"/jobs/{job_id}/logs", params={"rank": rank, "stream": stream})
                assert r.status_code == 200 and r.json()["complete"], r.text
                answers.append(r.text)
                logs[rank, stream] = r.json()["text"]
        has_secret = c.get(f"/jobs/{job_id}/metrics", params={"name": "has_secret"}).json()

    # It reached every rank...
    assert [m["value"] for m in has_secret["items"]] == [1, 1]
    digest = hashlib.sha256(SECRET.encode()).hexdigest()
    assert all(f"HF_TOKEN sha256 {digest}" in logs[rank, "combined"] for rank in (0, 1))
    # ...the spec shows its name only, next to the plain env it is not part of...
    assert job["spec"]["secret_env"] == {"HF_TOKEN": "hf"} and job["spec"]["env"] == {
        "PLAIN": "shown"}
    # ...and its value is in no answer, no file of the run directory, no server log line.
    for secret in (SECRET, OTHER):
        assert not [a[:200] for a in answers if secret in a]
        run_dir = server.home / "runs" / str(job_id)
        files = [p for p in run_dir.rglob("*") if p.is_file()]
        assert len(files) > 10, "spec.json, launch.json, logs, spools, attempts..."
        assert [p for p in files if secret.encode() in p.read_bytes()] == []
        assert secret not in server.log.read_text(errors="replace")


def test_unknown_or_misplaced_secrets_are_422_naming_the_field(server: LiveServer) -> None:
    with server.client() as c:
        c.headers["Authorization"] = f"Bearer {API_TOKEN}"
        stored = c.get("/jobs").json()["items"]
        cases = [
            ({"entrypoint": "secret.py", "secret_env": {"HF_TOKEN": "nope"}}, "unknown secret 'nope'"),
            ({"secret_env": {"HF_TOKEN": "hf"}}, "only allowed with 'entrypoint'"),
            ({"entrypoint": "secret.py", "secret_env": {"LD_PRELOAD": "hf"}}, "reserved"),
            ({"entrypoint": "secret.py", "env": {"HF_TOKEN": "x"},
              "secret_env": {"HF_TOKEN": "hf"}}, "also set in 'env'"),
            ({"entrypoint": "secret.py", "secret_env": {"HF_TOKEN": "../x"}}, "pattern"),
        ]
        for body, words in cases:
            r = c.post("/jobs", json=body)
            assert r.status_code == 422, r.text
            assert "secret_env" in r.json()["message"] and words in r.text, r.text
            assert SECRET not in r.text
        assert c.get("/jobs").json()["items"] == stored, "nothing stored"


def test_resolving_reads_the_file_each_time_and_never_quotes_it(
    tmp_path: Path, secrets_file: Path
) -> None:
    assert resolve({"HF_TOKEN": "hf"}, secrets_file) == {"HF_TOKEN": SECRET}
    assert resolve({}, None) == {}
    with pytest.raises(SecretRefused, match="TORCHYARD_SECRETS_FILE is not set"):
        check_names({"HF_TOKEN": "hf"}, None)
    secrets_file.write_text(json.dumps({"wandb": OTHER}))  # edited: 'hf' is gone at launch
    with pytest.raises(SecretRefused, match="unknown secret 'hf'; this server defines: wandb"):
        resolve({"HF_TOKEN": "hf"}, secrets_file)
    broken = tmp_path / "broken.json"
    broken.write_text('{"hf": "' + SECRET + '"')  # not JSON: the message must not quote it
    with pytest.raises(SecretRefused) as info:
        check_names({"HF_TOKEN": "hf"}, broken)
    assert SECRET not in str(info.value) and "not valid JSON" in str(info.value)
    with pytest.raises(SecretRefused, match="cannot read"):
        check_names({"HF_TOKEN": "hf"}, tmp_path / "missing.json")
