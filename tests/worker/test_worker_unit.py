"""Fast, real tests of the worker package (no mocks of our own code)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.worker.rungroup import run_rank_group
from torchyard_contract.spec import DatasetName, JobSpec, ModelName
from worker.datasets import load_dataset
from worker.env import WorkerEnv
from worker.models import build_model
from worker.reporter import Reporter, encode_value


@pytest.mark.parametrize("name", list(ModelName))
@pytest.mark.parametrize("shape", [(1, 8, 8), (3, 32, 32)])
def test_models_output_shape(name: ModelName, shape: tuple[int, int, int]) -> None:
    model = build_model(name, shape, 10)
    model.eval()
    with torch.no_grad():
        out = model(torch.randn(2, *shape))
    assert out.shape == (2, 10)


def test_digits_shapes_and_fixed_split(tmp_path: Path) -> None:
    spec = JobSpec(dataset=DatasetName.digits)
    a = load_dataset(spec, tmp_path)
    b = load_dataset(JobSpec(dataset=DatasetName.digits, seed=7), tmp_path)
    assert a.input_shape == (1, 8, 8) and a.num_classes == 10
    assert a.test_x is not None and a.test_y is not None
    assert len(a.train_x) + len(a.test_x) == 1797
    assert len(a.test_x) == int(1797 * 0.2)
    assert a.train_x.dtype == torch.float32 and a.train_y.dtype == torch.int64
    # The split does not depend on the job seed.
    assert torch.equal(a.test_y, b.test_y)  # type: ignore[arg-type]


def test_digits_read_without_scikit_learn_are_load_digits_exactly() -> None:
    """The file read directly is the one ``load_digits`` reads, to the last pixel and label,
    and reading it imports no scikit-learn (run in a fresh interpreter to tell)."""
    from sklearn.datasets import load_digits

    from worker.datasets import digits_arrays, digits_file

    assert digits_file() is not None  # else every rank would import scikit-learn again
    images, labels = digits_arrays()
    bunch = load_digits()
    assert torch.equal(images, torch.tensor(bunch.images, dtype=torch.float32))
    assert torch.equal(labels, torch.tensor(bunch.target, dtype=torch.int64))
    probe = subprocess.run(
        [sys.executable, "-c", "import sys; from worker.datasets import digits_arrays; "
         "digits_arrays(); print(any(m.startswith('sklearn') for m in sys.modules))"],
        capture_output=True, text=True, check=True, timeout=120,
    )
    assert probe.stdout.strip() == "False", probe.stdout + probe.stderr


def test_synthetic_matches_model_input(tmp_path: Path) -> None:
    small = load_dataset(JobSpec(dataset=DatasetName.synthetic, synthetic_samples=100), tmp_path)
    big = load_dataset(
        JobSpec(dataset=DatasetName.synthetic, model=ModelName.resnet18, synthetic_samples=100),
        tmp_path,
    )
    assert small.input_shape == (1, 8, 8) and big.input_shape == (3, 32, 32)
    again = load_dataset(JobSpec(dataset=DatasetName.synthetic, synthetic_samples=100), tmp_path)
    assert torch.equal(small.train_x, again.train_x)


def test_missing_torchvision_dataset_names_dataset_and_path(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match=rf"mnist not found under {tmp_path}.*download: false"):
        load_dataset(JobSpec(dataset=DatasetName.mnist), tmp_path)


def test_encode_value_strict_json() -> None:
    assert [encode_value(v) for v in (float("nan"), float("inf"), -float("inf"), 1.5, 3)] == [
        "NaN",
        "Infinity",
        "-Infinity",
        1.5,
        3,
    ]


def test_reporter_spools_without_api(tmp_path: Path) -> None:
    env = WorkerEnv.from_environ(
        {"RANK": "1", "TORCHYARD_RUN_DIR": str(tmp_path), "TORCHYARD_ATTEMPT": "2"}
    )
    reporter = Reporter(env)
    assert not reporter.enabled
    reporter.report(epoch=1, loss=float("nan"), samples=10)
    reporter.close(timeout_s=1)
    lines = (tmp_path / "spool" / "rank-1.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert [(r["name"], r["value"], r["rank"], r["attempt"], r["epoch"]) for r in records] == [
        ("loss", "NaN", 1, 2, 1),
        ("samples", 10, 1, 2, 1),
    ]


def test_reporter_noop_without_run_dir() -> None:
    reporter = Reporter(WorkerEnv.from_environ({}))
    reporter.report(epoch=None, step=3, value=1.0)
    reporter.close(timeout_s=1)
    assert reporter.spool_path is None and not reporter.enabled


def test_reporter_close_is_bounded_when_api_unreachable(tmp_path: Path) -> None:
    # Port 9 on localhost: connection refused → retries; close() must still return promptly.
    env = WorkerEnv.from_environ(
        {
            "TORCHYARD_API_URL": "http://127.0.0.1:9",
            "TORCHYARD_JOB_ID": "1",
            "TORCHYARD_RUN_DIR": str(tmp_path),
        }
    )
    reporter = Reporter(env)
    assert reporter.enabled
    reporter.report(epoch=1, loss=1.0)
    import time

    started = time.monotonic()
    reporter.close(timeout_s=0.5)
    assert time.monotonic() - started < 2
    assert (tmp_path / "spool" / "rank-0.jsonl").exists()


def test_real_two_rank_run(tmp_path: Path, warm_ranks: str) -> None:
    """The built-in trainer as a real 2-rank group, forked warm as the product does by default
    (cold groups run through the server: tests/run/test_e2e.py)."""
    spec = JobSpec(
        name="t", dataset=DatasetName.synthetic, epochs=2, batch_size=32, synthetic_samples=256
    )
    run_rank_group(tmp_path, spec, warm_ranks)
    for rank in (0, 1):
        assert (tmp_path / "attempts" / "1" / f"ready-rank-{rank}").exists()
        records = [
            json.loads(line)
            for line in (tmp_path / "spool" / f"rank-{rank}.jsonl").read_text().splitlines()
        ]
        losses = {r["epoch"]: r["value"] for r in records if r["name"] == "loss"}
        assert set(losses) == {1, 2}
        assert all(r["rank"] == rank for r in records)
        names = {r["name"] for r in records}
        assert names == {"loss", "samples", "seconds", "samples_per_s", "test_accuracy"}
        assert {r["value"] for r in records if r["name"] == "samples"} == {
            103
        }  # ceil((256 - 51 test) / 2)


def test_reporter_sends_with_bearer_and_retries_5xx(tmp_path: Path) -> None:
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    received: list[tuple[str, str, dict[str, object]]] = []
    answers = [503, 200]  # first attempt fails, the retry must succeed

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            received.append((self.path, self.headers["Authorization"], body))
            self.send_response(answers.pop(0) if answers else 200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        env = WorkerEnv.from_environ(
            {
                "TORCHYARD_API_URL": f"http://127.0.0.1:{server.server_address[1]}/",
                "TORCHYARD_JOB_ID": "7",
                "TORCHYARD_JOB_TOKEN": "secret",
                "TORCHYARD_RUN_DIR": str(tmp_path),
            }
        )
        reporter = Reporter(env)
        reporter.report(epoch=2, loss=float("inf"))
        reporter.close(timeout_s=5)
    finally:
        server.shutdown()
    assert len(received) == 2 and received[0] == received[1]
    path, auth, body = received[1]
    assert path == "/jobs/7/records" and auth == "Bearer secret"
    (record,) = body["records"]  # type: ignore[misc]
    assert record["value"] == "Infinity" and record["epoch"] == 2 and record["step"] is None
