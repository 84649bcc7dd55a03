"""The CI flow (issue 24, item 6): the commands of examples/ci/torchyard.yml against a live
server: ``submit --workdir DIR ENTRYPOINT --follow -- ARGS`` (packed honouring .gitignore,
uploaded only when HEAD says missing), ``artifacts`` (list, download), ``delete``.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT, LiveServer

TRAIN = '''\
import json, os, sys
from helper import GREETING
with open("config.json") as f:
    config = json.load(f)
if "--fail" in sys.argv:
    raise SystemExit("asked to fail")
out = os.environ["TORCHYARD_OUTPUT_DIR"]
with open(os.path.join(out, "model.pt"), "w") as f:
    json.dump({"greeting": GREETING, "config": config, "args": sys.argv[1:],
               "ignored_present": os.path.exists("big.bin")}, f)
'''


@pytest.fixture
def server(shared_script_server: LiveServer) -> LiveServer:
    """The shared server with API tokens (package jobs need them); the test reads its own jobs."""
    return shared_script_server


def _cli(server: LiveServer, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TORCHYARD_URL": server.url, "TORCHYARD_TOKEN": server.token or "",
           "COLUMNS": "200", "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run([sys.executable, "-m", "service", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=180)


def _checkout(tmp_path: Path) -> Path:
    repo = tmp_path / "checkout"
    repo.mkdir()
    (repo / "train.py").write_text(TRAIN)
    (repo / "helper.py").write_text("GREETING = 'hello'\n")
    (repo / "config.json").write_text(json.dumps({"lr": 0.1}))
    (repo / ".gitignore").write_text("big.bin\n")
    (repo / "big.bin").write_bytes(b"\0" * 1024)
    (repo / ".git").mkdir()
    (repo / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    return repo


def _job_id(stdout: str) -> int:
    return int(stdout.split("job ", 1)[1].split()[0])


def test_ci_flow(server: LiveServer, tmp_path: Path) -> None:
    repo = _checkout(tmp_path)
    run = _cli(server, "submit", "--workdir", ".", "train.py", "--follow", "--",
               "--epochs", "3", cwd=repo)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "uploaded" in run.stderr
    job_id = _job_id(run.stdout)
    listing = _cli(server, "artifacts", str(job_id), cwd=repo)
    assert listing.returncode == 0 and "model.pt" in listing.stdout, listing.stderr
    got = _cli(server, "artifacts", str(job_id), "model.pt", "-o", "model.pt", cwd=tmp_path)
    assert got.returncode == 0, got.stderr
    model = json.loads((tmp_path / "model.pt").read_text())
    assert model == {"greeting": "hello", "config": {"lr": 0.1}, "args": ["--epochs", "3"],
                     "ignored_present": False}
    # Unchanged code: only the HEAD; a failing job fails the pipeline (exit 1).
    again = _cli(server, "submit", "--workdir", ".", "train.py", "--follow", "--", "--fail",
                 cwd=repo)
    assert again.returncode == 1, again.stdout + again.stderr
    assert "already on the server" in again.stderr
    gone = _cli(server, "delete", str(job_id), cwd=repo)
    assert gone.returncode == 0, gone.stderr
    with server.client() as c:
        assert c.get(f"/jobs/{job_id}").status_code == 404
    assert not (server.home / "runs" / str(job_id)).exists()
    assert _cli(server, "delete", str(job_id), cwd=repo).returncode == 5


def test_workflow_runs_these_commands() -> None:
    workflow = (REPO_ROOT / "examples" / "ci" / "torchyard.yml").read_text()
    for command in ("torchyard submit --workdir . train.py --follow", "torchyard artifacts",
                    "-o model.pt", "torchyard delete"):
        assert command in workflow
