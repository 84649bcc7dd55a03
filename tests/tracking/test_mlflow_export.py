"""Every job's records in MLflow and in TensorBoard, against a real ``mlflow server`` (its own
venv, a SQLite store, ``--serve-artifacts``): a 2-rank built-in job and a 2-rank script job with
every (rank, epoch) point once, the dashboard's mean, params, tags and FINISHED; a failing job
FAILED with its reason; a cancelled one KILLED, its event files readable while it ran; a sweep
as a parent run and child runs with the best one tagged; ``log_outputs`` byte for byte. One
torchyard server (warm ranks, script jobs, a small artifact bound) is shared by the module."""

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import (
    LiveServer,
    _copy_sqlite,
    _kill_left_behind,
    _start_server,
    _stop_server,
    cli,
    every_record,
    free_port,
    hooks,
)
from tests.tracking.exports import (
    assert_event_files_hold,
    assert_every_point_once,
    run_of,
    submit,
    wait_export,
)
from tests.tracking.mlflowserver import MlflowReader, MlflowServer, params, tags

TOKEN = "tracking-tests-api-token-0123456789"
MLFLOW_TOKEN = "mlflow-bearer-token-never-shown-0123"  # sent to MLflow, which ignores it here
MAX_ARTIFACT_BYTES = 4096
QUICK = {"dataset": "synthetic", "synthetic_samples": 64, "batch_size": 32, "device": "cpu",
         "checkpoint_every": 0}

# Two ranks: per-epoch loss and acc, per-step batch_loss; rank 0 leaves outputs, one of them
# over the server's artifact bound.
SCRIPT = '''\
import os
import pathlib

import worker

rank = int(os.environ["RANK"])
for epoch in (1, 2):
    for step in (1, 2):
        worker.report(epoch=epoch, step=(epoch - 1) * 2 + step, batch_loss=1.0 / (step + rank))
    worker.report(epoch=epoch, loss=1.0 / (epoch + rank), acc=0.25 * epoch + 0.125 * rank)
if rank == 0:
    out = pathlib.Path(os.environ["TORCHYARD_OUTPUT_DIR"])
    (out / "model.bin").write_bytes(bytes(range(256)) * 4)
    (out / "sub").mkdir()
    (out / "sub" / "notes.txt").write_text("digits, two ranks\\n")
    (out / "big.bin").write_bytes(os.urandom(8192))
'''

# A job that turns RUN_DIR/tensorboard into a symlink to a directory of the test's (argv[1])
# before it reports: the server must write no event file there.
HOSTILE = """\
import os
import sys

import worker

os.symlink(sys.argv[1], os.path.join(os.environ["TORCHYARD_RUN_DIR"], "tensorboard"))
worker.report(epoch=1, loss=0.5)
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, _migrated_sqlite: Path,
           mlflow_server: MlflowServer) -> Iterator[LiveServer]:
    root = tmp_path_factory.mktemp("tracking")
    (root / "scripts").mkdir()
    (root / "scripts" / "report.py").write_text(SCRIPT)
    (root / "scripts" / "hostile.py").write_text(HOSTILE)
    _copy_sqlite(_migrated_sqlite, root / "home")
    port = free_port()
    live = _start_server(root / "home", {
        "TORCHYARD_MLFLOW_TRACKING_URI": mlflow_server.url,
        "TORCHYARD_PUBLIC_URL": f"http://127.0.0.1:{port}",
        "TORCHYARD_SCRIPT_DIRS": str(root / "scripts"), "TORCHYARD_API_TOKENS": TOKEN,
        "TORCHYARD_MLFLOW_MAX_ARTIFACT_BYTES": str(MAX_ARTIFACT_BYTES),
        "TORCHYARD_MLFLOW_TOKEN": MLFLOW_TOKEN,
    }, port)
    yield live
    _stop_server(live)
    _kill_left_behind(root)


def test_a_two_rank_job_is_one_run_with_every_point_once(
    server: LiveServer, mlflow: MlflowReader, tmp_path: Path,
) -> None:
    job_id = submit(server, {"name": "digits-ddp", "dataset": "digits", "epochs": 2,
                             "batch_size": 256, "lr": 0.1, "nproc_per_node": 2, "device": "cpu",
                             "checkpoint_every": 0, "mlflow": {"experiment": "digits-lr"}})
    job = wait_export(server, job_id)
    assert job["state"] == "succeeded", job["reason"]
    run = assert_every_point_once(server, mlflow, job_id)
    assert job["mlflow"]["run_id"] == run["info"]["run_id"]
    assert job["mlflow"]["experiment"] == "digits-lr"
    assert run["info"]["status"] == "FINISHED" and run["info"]["run_name"] == "digits-ddp"
    assert run["info"]["end_time"] >= run["info"]["start_time"]
    t = tags(run)
    assert t["torchyard.job_id"] == str(job_id)
    assert t["torchyard.url"] == f"{server.url}/#/jobs/{job_id}"
    assert t["mlflow.source.name"] == "torchyard built-in mlp"
    assert t["torchyard.state"] == "succeeded"
    assert "torchyard.reason" not in t
    p = params(run)
    assert p["lr"] == "0.1" and p["epochs"] == "2" and p["nproc_per_node"] == "2"
    assert p["dataset"] == "digits" and p["model"] == "mlp" and p["nnodes"] == "1"
    # TensorBoard: the files the CLI fetches open in TensorBoard's own reader.
    fetched = cli(server, "tensorboard", str(job_id), "-o", str(tmp_path / "tb"),
                  env={"TORCHYARD_TOKEN": TOKEN})
    assert fetched.returncode == 0, fetched.stderr
    assert_event_files_hold(tmp_path / "tb" / f"digits-ddp-{job_id}", every_record(server, job_id))
    # The MLflow token is a server secret: in no answer, no log line, no file of the job's.
    with server.client() as c:
        assert MLFLOW_TOKEN not in c.get(f"/jobs/{job_id}").text
    assert MLFLOW_TOKEN not in server.log.read_text()
    run_dir = server.home / "runs" / str(job_id)
    assert not [f for f in run_dir.rglob("*") if f.is_file() and MLFLOW_TOKEN.encode() in f.read_bytes()]


def test_a_script_job_with_log_outputs_uploads_them_byte_for_byte(
    server: LiveServer, mlflow: MlflowReader,
) -> None:
    job_id = submit(server, {"name": "script", "entrypoint": "report.py", "args": ["--x", "1"],
                             "nproc_per_node": 2, "mlflow": {"log_outputs": True}})
    job = wait_export(server, job_id)
    assert job["state"] == "succeeded", job["reason"]
    run = assert_every_point_once(server, mlflow, job_id)
    assert run["info"]["status"] == "FINISHED"
    assert job["mlflow"]["experiment"] == "torchyard"  # no team, no experiment: the default
    assert tags(run)["mlflow.source.name"] == "report.py"
    assert params(run) == {"args": "--x 1", "nproc_per_node": "2", "nnodes": "1"}
    # Per-step records are points of their rank's series at their step; no mean of them.
    steps = [m["step"] for m in mlflow.history(run["info"]["run_id"], "batch_loss/rank1")]
    assert sorted(steps) == [1, 2, 3, 4]
    assert mlflow.history(run["info"]["run_id"], "batch_loss") == []
    outputs = server.home / "runs" / str(job_id) / "outputs"
    for name in ("model.bin", "sub/notes.txt"):
        assert mlflow.artifact(run, name) == (outputs / name).read_bytes()
    skipped = tags(run)["torchyard.outputs_skipped"]
    assert "big.bin" in skipped and "8192 bytes" in skipped and str(MAX_ARTIFACT_BYTES) in skipped


def test_a_failing_job_is_failed_with_its_reason(server: LiveServer, mlflow: MlflowReader) -> None:
    job_id = submit(server, {**QUICK, "epochs": 1, "nproc_per_node": 2,
                             "labels": hooks(fail_rank=1)})
    job = wait_export(server, job_id)
    assert job["state"] == "failed"
    run = run_of(server, mlflow, job_id)
    assert run["info"]["status"] == "FAILED"
    assert job["reason"] and tags(run)["torchyard.reason"] == job["reason"]


def test_a_cancelled_job_is_killed_and_its_event_files_grow_while_it_runs(
    server: LiveServer, mlflow: MlflowReader, tmp_path: Path,
) -> None:
    job_id = submit(server, {**QUICK, "name": "long", "epochs": 200, "nproc_per_node": 1,
                             "labels": hooks(epoch_sleep_s=0.3)})
    # While it runs: its run RUNNING, its event files readable with what was stored so far.
    server.wait_for(job_id, {"running"})
    job = wait_export(server, job_id, terminal=False)
    assert job["mlflow"]["run_id"]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    board_dir = tmp_path / "tb" / f"long-{job_id}"
    deadline = time.monotonic() + 60
    while True:
        fetched = cli(server, "tensorboard", str(job_id), "-o", str(tmp_path / "tb"),
                      env={"TORCHYARD_TOKEN": TOKEN})
        assert fetched.returncode == 0, fetched.stderr
        if board_dir.exists():
            board = EventAccumulator(str(board_dir))
            board.Reload()
            if "loss/rank0" in board.Tags()["scalars"] and len(board.Scalars("loss/rank0")) >= 2:
                break
        assert time.monotonic() < deadline, "no two epochs in the event files after 60 s"
    with server.client() as c:
        assert c.get(f"/jobs/{job_id}").json()["state"] == "running"
        assert [e.step for e in board.Scalars("loss/rank0")][:2] == [1, 2]
        assert run_of(server, mlflow, job_id)["info"]["status"] == "RUNNING"
        c.post(f"/jobs/{job_id}/cancel")
    job = wait_export(server, job_id)
    assert job["state"] == "cancelled"
    run = assert_every_point_once(server, mlflow, job_id)
    assert run["info"]["status"] == "KILLED"
    assert tags(run)["torchyard.reason"] == "cancelled by user"


def test_a_sweep_is_a_parent_run_with_its_trials_as_children(
    server: LiveServer, mlflow: MlflowReader,
) -> None:
    with server.client() as c:
        answer = c.post("/sweeps", json={
            "name": "lr-grid", "method": "grid", "parallel": 2,
            "spec": {**QUICK, "epochs": 1, "mlflow": {"experiment": "sweeps"}},
            "space": {"lr": {"type": "choice", "values": [0.01, 0.5]}},
            "objective": {"metric": "loss", "mode": "min"},
        })
    assert answer.status_code == 201, answer.text
    sweep_id = answer.json()["id"]
    deadline = time.monotonic() + 150
    while True:
        with server.client() as c:
            sweep = c.get(f"/sweeps/{sweep_id}").json()
        parents = mlflow.runs(f"tags.`torchyard.sweep_id` = '{sweep_id}'")
        parent = [r for r in parents if "torchyard.job_id" not in tags(r)]
        if sweep["state"] != "running" and parent and parent[0]["info"]["status"] != "RUNNING":
            break
        assert time.monotonic() < deadline, (sweep, parents)
        time.sleep(0.5)
    assert sweep["state"] == "succeeded", sweep
    parent_run = parent[0]
    assert parent_run["info"]["status"] == "FINISHED"
    assert parent_run["info"]["run_name"] == "lr-grid"
    children = [r for r in mlflow.runs(f"tags.`torchyard.sweep_id` = '{sweep_id}'")
                if "torchyard.job_id" in tags(r)]
    trial_ids = sorted(t["job_id"] for t in sweep["trials"])
    assert sorted(int(tags(r)["torchyard.job_id"]) for r in children) == trial_ids
    for child in children:
        assert tags(child)["mlflow.parentRunId"] == parent_run["info"]["run_id"]
        assert params(child)["lr"] in ("0.01", "0.5")
    best = sweep["best"]["job_id"]
    assert tags(parent_run)["torchyard.best_job_id"] == str(best)
    best_run = run_of(server, mlflow, best)
    assert tags(best_run).get("torchyard.best_trial") == "true"
    assert tags(parent_run)["torchyard.best_run_id"] == best_run["info"]["run_id"]
    assert [tags(r).get("torchyard.best_trial") for r in children].count("true") == 1


def test_a_job_that_says_mlflow_false_is_not_exported(
    server: LiveServer, mlflow: MlflowReader,
) -> None:
    job_id = submit(server, {**QUICK, "epochs": 1, "mlflow": False, "priority": -1000})
    with server.client() as c:
        job = c.get(f"/jobs/{job_id}").json()
        assert job["mlflow"] is None and job["spec"]["mlflow"] is False
        c.post(f"/jobs/{job_id}/cancel")
    assert mlflow.runs(f"tags.`torchyard.job_id` = '{job_id}'") == []


def test_a_job_that_swaps_its_tensorboard_folder_for_a_symlink_gets_nothing_written_there(
    server: LiveServer, mlflow: MlflowReader, tmp_path: Path,
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    job_id = submit(server, {"entrypoint": "hostile.py", "args": [str(elsewhere)]})
    job = wait_export(server, job_id)
    assert job["state"] == "succeeded", job["reason"]
    assert_every_point_once(server, mlflow, job_id)  # MLflow does not depend on the files
    assert list(elsewhere.iterdir()) == []
    with server.client() as c:
        listed = [i["path"] for i in c.get(f"/jobs/{job_id}/artifacts").json()["items"]]
    assert not [p for p in listed if p.startswith("tensorboard/")], listed
