"""What the tracking tests check of an exported job, shared by their files: every record a point
of its rank's series once, the mean series the dashboard draws, the run's end, the event files."""

import math
import time
from collections import Counter
from pathlib import Path

from tests.conftest import LiveServer, every_record
from tests.tracking.mlflowserver import MlflowReader

EXPORT_TIMEOUT_S = 150.0
# TensorBoard keeps a scalar as a 32-bit float.
FLOAT32_REL = 1e-6


def submit(server: LiveServer, spec: dict) -> int:
    """Submit ``spec``; its job's id (201 asserted)."""
    with server.client() as c:
        answer = c.post("/jobs", json=spec)
    assert answer.status_code == 201, answer.text
    return answer.json()["id"]


def wait_export(server: LiveServer, job_id: int, state: str = "exported",
                timeout_s: float = EXPORT_TIMEOUT_S, terminal: bool = True) -> dict:
    """Until ``GET /jobs/{id}`` says the MLflow export is ``state`` (and, with ``terminal``, the
    job is over); the job as it is then."""
    deadline = time.monotonic() + timeout_s
    with server.client() as c:
        while True:
            assert server.proc.poll() is None, f"server died:\n{server.log.read_text()[-3000:]}"
            job = c.get(f"/jobs/{job_id}").json()
            export = job.get("mlflow") or {}
            over = job["state"] in ("succeeded", "failed", "cancelled")
            if export.get("state", "").startswith(state) and (over or not terminal):
                return job
            assert time.monotonic() < deadline, f"job {job_id}: export not {state}: {job}"
            time.sleep(0.25)


def run_of(server: LiveServer, mlflow: MlflowReader, job_id: int) -> dict:
    """The job's run, by the id ``GET /jobs/{id}`` names (job ids of other test servers that
    export to the same MLflow server are tagged alike), checked against its tags."""
    with server.client() as c:
        run_id = c.get(f"/jobs/{job_id}").json()["mlflow"]["run_id"]
    run = mlflow.run(run_id)
    assert {t["key"]: t["value"] for t in run["data"]["tags"]}["torchyard.job_id"] == str(job_id)
    return run


def _wire(value: object) -> float:
    return float(str(value).replace("Infinity", "inf")) if isinstance(value, str) else float(value)


def expected_rank_points(records: list[dict]) -> dict[str, Counter]:
    """``<name>/rank<r>`` → the (step, timestamp ms, value) of each record, as a multiset."""
    series: dict[str, Counter] = {}
    for r in records:
        step = r["epoch"] if r["step"] is None else r["step"]
        key = f"{r['name']}/rank{r['rank']}"
        series.setdefault(key, Counter())[(step, int(round(r["time"] * 1000)), _wire(r["value"]))] += 1
    return series


def assert_every_point_once(server: LiveServer, mlflow: MlflowReader, job_id: int) -> dict:
    """The run of the job holds each stored record once as a point of its rank's series, and
    its per-epoch metrics' mean series is the dashboard's mean (``/jobs/{id}/series``), one
    point per epoch. Returns the run."""
    records = every_record(server, job_id)
    assert records, f"job {job_id} reported nothing"
    run = run_of(server, mlflow, job_id)
    run_id = run["info"]["run_id"]
    for key, want in expected_rank_points(records).items():
        got = Counter((m["step"], m["timestamp"], _wire(m["value"]))
                      for m in mlflow.history(run_id, key))
        assert got == want, (key, got, want)
    names = {r["name"] for r in records if r["step"] is None}
    with server.client() as c:
        for name in names:
            mean = c.get(f"/jobs/{job_id}/series", params={"name": name}).json()["mean"]
            history = sorted((m["step"], m["timestamp"], _wire(m["value"]))
                             for m in mlflow.history(run_id, name))
            assert [s for s, _, _ in history] == mean["x"], (name, history, mean)
            for (_, _, value), drawn in zip(history, mean["y"], strict=True):
                assert math.isclose(value, _wire(drawn), rel_tol=1e-12), (name, value, drawn)
    return run


def assert_event_files_hold(directory: Path, records: list[dict]) -> None:
    """TensorBoard's own reader finds every (rank, epoch) scalar of ``records`` in the event
    files under ``directory`` (values as 32-bit floats), once, and a mean series per metric."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    files = list(directory.rglob("*tfevents*"))
    assert files, f"no event file under {directory}"
    board = EventAccumulator(str(files[0].parent))
    board.Reload()
    tags = set(board.Tags()["scalars"])
    for key, want in expected_rank_points(records).items():
        assert key in tags, (key, sorted(tags))
        got = Counter((e.step, round(e.wall_time * 1000)) for e in board.Scalars(key))
        assert got == Counter({(s, t): n for (s, t, _), n in want.items()}), (key, got, want)
        values = {(e.step, round(e.wall_time * 1000)): e.value for e in board.Scalars(key)}
        for (step, stamp, value), _ in want.items():
            assert math.isclose(values[(step, stamp)], value, rel_tol=FLOAT32_REL), (key, step)
    for name in {r["name"] for r in records if r["step"] is None}:
        assert name in tags, (name, sorted(tags))
