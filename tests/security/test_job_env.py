"""What a rank's environment may hold of the server's (issue 23, finding 6).

A real ``torchyard serve --workers 2`` (so ``PROMETHEUS_MULTIPROC_DIR`` is set, as in
production) with every kind of server-only variable — its secrets, its database URL, its
settings, the CLI's token — runs a 2-rank script job that writes each rank's whole environment
into the run directory. From the server's side a rank may hold the operator's ordinary variables
(``PATH``, ``HOME``, …) and the variables torchyard sets for that job; nothing else.
"""

import json
import os
from collections.abc import Callable
from pathlib import Path

from tests.conftest import LiveServer

API_TOKEN = "job-env-tests-api-token-0123456789"
DUMP_ENV = """\
import json
import os

rank = os.environ.get("RANK", "0")
with open(os.path.join(os.environ["TORCHYARD_RUN_DIR"], f"env-rank-{rank}.json"), "w") as f:
    json.dump(dict(os.environ), f)
"""
# The only TORCHYARD_* variables a rank may hold: those torchyard sets for this job
# (torchyard_contract.envnames), and the test suite's rank hooks (tests/rankhooks).
JOB_VARIABLES = {
    "TORCHYARD_API_URL", "TORCHYARD_JOB_ID", "TORCHYARD_JOB_TOKEN", "TORCHYARD_RUN_DIR",
    "TORCHYARD_ATTEMPT", "TORCHYARD_DEVICE", "TORCHYARD_BACKEND", "TORCHYARD_RESUME_DIR",
    "TORCHYARD_OUTPUT_DIR",  # the job's own outputs (issue 24)
}
TEST_HOOK_PREFIX = "TORCHYARD_TEST_"
# Server-only, by name: each is set on the server below (or by ``serve --workers``).
SERVER_ONLY = {
    "PROMETHEUS_MULTIPROC_DIR", "TORCHYARD_DATABASE_URL", "TORCHYARD_SECRETS_FILE",
    "TORCHYARD_API_TOKENS", "TORCHYARD_API_TOKENS_FILE", "TORCHYARD_TOKEN", "TORCHYARD_URL",
    "TORCHYARD_HOME", "TORCHYARD_HOST", "TORCHYARD_PORT", "TORCHYARD_SCRIPT_DIRS",
    "TORCHYARD_CPU_SLOTS", "TORCHYARD_GPUS", "TORCHYARD_DATA_DIRS", "TORCHYARD_STOP_GRACE_S",
    "TORCHYARD_ALLOWED_HOSTS", "TORCHYARD_MLFLOW_TOKEN",
}


def test_a_rank_inherits_nothing_server_only(
    live_server_factory: Callable[..., LiveServer], tmp_path: Path
) -> None:
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    (scripts / "dump_env.py").write_text(DUMP_ENV)
    secrets = tmp_path / "secrets.json"
    secrets.write_text(json.dumps({"hf": "a-secret-value-0123456789"}))
    secrets.chmod(0o600)
    tokens_file = tmp_path / "tokens"
    tokens_file.write_text(API_TOKEN + "\n")
    home = tmp_path / "home"
    server = live_server_factory(
        home, None, ("--workers", "2"),
        TORCHYARD_SCRIPT_DIRS=str(scripts), TORCHYARD_API_TOKENS=API_TOKEN,
        TORCHYARD_API_TOKENS_FILE=str(tokens_file), TORCHYARD_SECRETS_FILE=str(secrets),
        TORCHYARD_DATABASE_URL=f"sqlite:///{home / 'store.db'}",
        TORCHYARD_TOKEN="the-cli-token-0123456789", TORCHYARD_URL="http://127.0.0.1:1",
        TORCHYARD_MLFLOW_TOKEN="the-mlflow-token-0123456789",
        OPERATOR_NOTE="an ordinary variable of the operator's",
    )
    with server.client() as c:
        c.headers["Authorization"] = f"Bearer {API_TOKEN}"
        r = c.post("/jobs", json={"entrypoint": "dump_env.py", "nproc_per_node": 2,
                                  "env": {"PLAIN": "the job's own"},
                                  "secret_env": {"HF_TOKEN": "hf"}})
        assert r.status_code == 201, r.text
        job_id = r.json()["id"]
    server.wait_for(job_id, {"succeeded"}, timeout_s=120)

    run_dir = home / "runs" / str(job_id)
    for rank in (0, 1):
        env = json.loads((run_dir / f"env-rank-{rank}.json").read_text())
        leaked = sorted(SERVER_ONLY & set(env))
        assert leaked == [], f"rank {rank} inherited server-only variables: {leaked}"
        others = sorted(
            name for name in env
            if name.startswith("TORCHYARD_") and name not in JOB_VARIABLES
            and not name.startswith(TEST_HOOK_PREFIX)
        )
        assert others == [], f"rank {rank} holds TORCHYARD_* variables of the server: {others}"
        assert "prometheus_multiproc_dir" not in env
        # What it does get: the operator's ordinary variables and its job's own.
        assert env["OPERATOR_NOTE"] == "an ordinary variable of the operator's"
        assert env["PATH"] and env["HOME"] == os.environ["HOME"]
        assert env["PLAIN"] == "the job's own" and env["HF_TOKEN"] == "a-secret-value-0123456789"
        assert env["TORCHYARD_JOB_ID"] == str(job_id) and env["TORCHYARD_JOB_TOKEN"]
        assert env["RANK"] == str(rank)
