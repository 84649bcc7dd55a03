"""A real MLflow tracking server for the tracking tests, from a virtual environment of its own.

MLflow is never installed into the project's environment (its pins clash with the server's):
:func:`ensure_venv` makes (or reuses) a venv at ``$TORCHYARD_MLFLOW_VENV``, else
``~/.cache/torchyard-mlflow-venv``, with the one pin of ``mlflow-requirements.txt``; ``.ci/run``
runs it as a step of its own (``python -m tests.tracking.mlflowserver``) before the test
command. :class:`MlflowServer` runs ``mlflow server`` on a SQLite store with ``--serve-artifacts``
into a temp dir, on a loopback port, one worker and no job runner; it is stopped by its process
group and can be started again on the same port and store (the "MLflow down mid-job" test).
Readers go through MLflow's REST API with httpx, as any client of the tracking server would.
"""

import fcntl
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

REQUIREMENTS = Path(__file__).with_name("mlflow-requirements.txt")
START_TIMEOUT_S = 180  # the first start migrates its store: ~45 s on a loaded 2-core machine
INSTALL_TIMEOUT_S = 1200


def pinned_version() -> str:
    match = re.search(r"^mlflow==(\S+)$", REQUIREMENTS.read_text(), flags=re.MULTILINE)
    assert match, f"{REQUIREMENTS} pins no mlflow"
    return match[1]


def venv_dir() -> Path:
    return Path(os.environ.get("TORCHYARD_MLFLOW_VENV")
                or Path.home() / ".cache" / "torchyard-mlflow-venv")


def _installed(venv: Path, version: str) -> bool:
    return (venv / "bin" / "mlflow").exists() and any(
        venv.glob(f"lib/python*/site-packages/mlflow-{version}.dist-info"))


def ensure_venv() -> Path:
    """The venv's ``mlflow`` program, installed first when missing (under a file lock: the
    xdist workers of one run share it). Raises ``RuntimeError`` saying why it cannot be had."""
    venv, version = venv_dir(), pinned_version()
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f".{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _installed(venv, version):
            for step in ([sys.executable, "-m", "venv", "--clear", str(venv)],
                         [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet",
                          "-r", str(REQUIREMENTS)]):
                done = subprocess.run(step, capture_output=True, text=True,
                                      timeout=INSTALL_TIMEOUT_S, check=False)
                if done.returncode != 0:
                    raise RuntimeError(f"cannot install {REQUIREMENTS.name} into {venv}: "
                                       f"{(done.stderr or done.stdout)[-1500:]}")
    return venv / "bin" / "mlflow"


@dataclass
class MlflowServer:
    program: Path
    root: Path
    port: int
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return self.root / "mlflow-server.log"

    def start(self) -> "MlflowServer":
        """Start (again) on this port and store; returns once ``/health`` answers."""
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        env = {k: v for k, v in env.items() if not k.startswith(("PYTEST_", "PYTHONPATH"))}
        self.proc = subprocess.Popen(
            [str(self.program), "server",
             "--backend-store-uri", f"sqlite:///{self.root / 'mlflow.db'}",
             "--serve-artifacts", "--artifacts-destination", str(self.root / "artifacts"),
             "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1"],
            env=env, cwd=self.root, stdout=self.log.open("ab"), stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        with httpx.Client(timeout=2) as client:
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"mlflow server exited:\n{self.log.read_text()[-3000:]}")
                try:
                    if client.get(f"{self.url}/health").status_code == 200:
                        return self
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"mlflow server not up in {START_TIMEOUT_S} s:\n"
                                       f"{self.log.read_text()[-3000:]}")
                time.sleep(0.3)

    def stop(self) -> None:
        """SIGTERM to its process group (the CLI and its uvicorn), then SIGKILL."""
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        try:  # what the group left (uvicorn's worker)
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class MlflowReader:
    """What a person sees in MLflow: runs, their tags, params, metric histories, artifacts."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.client = httpx.Client(base_url=f"{url}/api/2.0", timeout=30)

    def close(self) -> None:
        self.client.close()

    def _get(self, path: str, **params: object) -> dict:
        response = self.client.get(path, params=params)
        assert response.status_code == 200, response.text
        return response.json()

    def runs(self, filter_: str) -> list[dict]:
        """Every run (of every experiment) matching an MLflow search filter."""
        experiments = self.client.post("/mlflow/experiments/search",
                                       json={"max_results": 1000}).json()["experiments"]
        answer = self.client.post("/mlflow/runs/search", json={
            "experiment_ids": [e["experiment_id"] for e in experiments],
            "filter": filter_, "max_results": 1000})
        assert answer.status_code == 200, answer.text
        return answer.json().get("runs", [])

    def run(self, run_id: str) -> dict:
        return self._get("/mlflow/runs/get", run_id=run_id)["run"]

    def history(self, run_id: str, key: str) -> list[dict]:
        return self._get("/mlflow/metrics/get-history", run_id=run_id, metric_key=key,
                         max_results=25000).get("metrics", [])

    def artifact(self, run: dict, path: str) -> bytes:
        root = run["info"]["artifact_uri"].removeprefix("mlflow-artifacts:").strip("/")
        response = self.client.get(f"/mlflow-artifacts/artifacts/{root}/{path}")
        assert response.status_code == 200, response.text
        return response.content


def tags(run: dict) -> dict[str, str]:
    return {t["key"]: t["value"] for t in run["data"].get("tags", [])}


def params(run: dict) -> dict[str, str]:
    return {p["key"]: p["value"] for p in run["data"].get("params", [])}


if __name__ == "__main__":  # .ci/run: make the venv before the test command
    print(ensure_venv())
