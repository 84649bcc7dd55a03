"""The exports to MLflow and TensorBoard (issue 48): what they cost ingestion, and how soon a
stored record is in MLflow.

Three servers side by side in one run, each the routes plus the exporter's threads
(``python -m bench.server`` with ``BENCH_TRACKING_EXPORTER``), each with one running job: export
off, TensorBoard only (the default without an MLflow server), MLflow and TensorBoard. 4 writers
post 1000-record batches to each in turn, as ``bench/ingest.py`` does; between two modes the
exporter is let catch up, so one mode's export never runs beside another's ingestion. The MLflow
server (``mlflow server``, SQLite store, from its own venv as in the tests:
``tests/tracking/mlflowserver.py``) runs on the same machine, so in the wall-clock ratio the
export pays MLflow's own CPU too; records per server CPU-second count only torchyard's process.

Then latency: one record a request, ``LATENCY_RATE`` a second, to the MLflow server's job, while
a poller reads the point's series back (``metrics/get-history``) every ``POLL_S``: time from the
``POST`` answered (stored) to the point first seen in MLflow, p50/p99. Goals: ingestion ≤ 5 %
slower with the export on; p99 ≤ 2 s.
"""

import json
import tempfile
import threading
import time
from pathlib import Path

import httpx

from bench.common import Row, percentile
from bench.ingest import measure
from bench.server import TRACKING_ENV, Server, insert_running_job, migrate
from service.run.socketport import free_port
from tests.tracking.mlflowserver import MlflowServer, ensure_venv

MODES = {"off": (False, False), "tensorboard": (False, True), "mlflow": (True, True)}
POLL_S = 0.05
LATENCY_RATE = 10.0  # records a second
CATCH_UP_TIMEOUT_S = 600.0


def _with_export(home: Path, job_id: int, mlflow: bool, tensorboard: bool) -> None:
    """The job's outbox row, as a submit on a server so configured writes it."""
    from service.store import tracking as store
    from service.store.db import make_engine, make_session_factory

    engine = make_engine(f"sqlite:///{(home / 'torchyard.db').resolve()}")
    try:
        with make_session_factory(engine)() as session:
            store.add_export(session, job_id=job_id, mlflow=mlflow, tensorboard=tensorboard,
                             experiment="bench" if mlflow else None)
            session.commit()
    finally:
        engine.dispose()


def _caught_up(server: Server, job_id: int, mlflow: bool) -> None:
    """Until the job's MLflow export has every stored record (TensorBoard writes are local and
    keep up; a short settle covers them)."""
    if not mlflow:
        time.sleep(1.0)
        return
    deadline = time.monotonic() + CATCH_UP_TIMEOUT_S
    with httpx.Client(base_url=server.url, timeout=30) as client:
        while (client.get(f"/jobs/{job_id}").json().get("mlflow") or {}).get("state") != "exported":
            if time.monotonic() > deadline:
                raise RuntimeError(f"the export did not catch up in {CATCH_UP_TIMEOUT_S} s")
            time.sleep(0.2)


def _latency(server: Server, job_id: int, token: str, mlflow_url: str, count: int
             ) -> list[float]:
    """Seconds from each record's POST answered to its point in MLflow."""
    with httpx.Client(base_url=server.url, timeout=30) as client:
        run_id = client.get(f"/jobs/{job_id}").json()["mlflow"]["run_id"]
    stored: dict[int, float] = {}
    seen: dict[int, float] = {}
    done = threading.Event()
    last = [time.perf_counter()]  # when the last record was stored

    def poll() -> None:
        with httpx.Client(base_url=f"{mlflow_url}/api/2.0/mlflow", timeout=30) as reader:
            while not done.is_set() or len(seen) < len(stored):
                answer = reader.get("/metrics/get-history", params={
                    "run_id": run_id, "metric_key": "latency/rank0", "max_results": 25000})
                now = time.perf_counter()
                for m in answer.json().get("metrics", []):
                    seen.setdefault(int(m["step"]), now)
                if done.is_set() and time.perf_counter() - last[0] > 60:
                    return
                time.sleep(POLL_S)

    poller = threading.Thread(target=poll)
    poller.start()
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    with httpx.Client(base_url=server.url, timeout=30, headers=headers) as client:
        for step in range(1, count + 1):
            body = {"records": [{"attempt": 1, "rank": 0, "epoch": 1, "step": step,
                                 "name": "latency", "value": float(step), "time": time.time()}]}
            answer = client.post(f"/jobs/{job_id}/records", content=json.dumps(body))
            assert answer.status_code == 200, answer.text
            stored[step] = last[0] = time.perf_counter()
            time.sleep(1 / LATENCY_RATE)
    done.set()
    poller.join()
    missing = sorted(set(stored) - set(seen))
    assert not missing, f"never seen in MLflow: {missing[:10]}"
    return [seen[s] - stored[s] for s in stored]


def run(smoke: bool) -> list[Row]:
    writers, batch_size = 4, 1000
    batches = 2 if smoke else 20
    count = 10 if smoke else 200
    with tempfile.TemporaryDirectory(prefix="bench-tracking-") as tmp:
        root = Path(tmp)
        (root / "mlflow-server").mkdir()
        mlflow = MlflowServer(ensure_venv(), root / "mlflow-server", free_port()).start()
        servers: dict[str, tuple[Server, int, str]] = {}
        try:
            for mode, (with_mlflow, tensorboard) in MODES.items():
                home = root / mode
                migrate(home)
                job_id, token = insert_running_job(home)
                (home / "runs" / str(job_id)).mkdir(parents=True)  # as a launch makes it
                _with_export(home, job_id, with_mlflow, tensorboard)
                env = {TRACKING_ENV: "1", "TORCHYARD_TENSORBOARD": str(tensorboard).lower(),
                       **({"TORCHYARD_MLFLOW_TRACKING_URI": mlflow.url} if with_mlflow else {})}
                server = Server.start(home, supervisor=False, env=env)
                servers[mode] = (server, job_id, token)
                measure(server, job_id, token, 1, 1, 10, first_rank=63)  # warm-up
                _caught_up(server, job_id, with_mlflow)
            results = {}
            for mode, (server, job_id, token) in servers.items():
                results[mode] = measure(server, job_id, token, writers, batches, batch_size)
                _caught_up(server, job_id, MODES[mode][0])
            server, job_id, token = servers["mlflow"]
            delays = _latency(server, job_id, token, mlflow.url, count)
        finally:
            for server, _, _ in servers.values():
                server.stop()
            mlflow.stop()
    for m in results.values():
        assert m["errors"] == 0 and m["records"] == m["expected"], m
    off = results["off"]
    note = f"{writers} writers x {batches} batches x {batch_size} records a mode"
    rows = [Row("tracking", "ingest records/s, export off", off["records_per_s"], "rec/s", "",
                note)]
    for mode in ("tensorboard", "mlflow"):
        m = results[mode]
        label = "TensorBoard" if mode == "tensorboard" else "MLflow + TensorBoard"
        rows += [
            Row("tracking", f"ingest ratio {label} / off", m["records_per_s"] / off["records_per_s"],
                "x", ">= 0.95" if mode == "mlflow" else "",
                "wall clock; the MLflow server shares the machine" if mode == "mlflow" else ""),
            Row("tracking", f"records per server CPU-s ratio {label} / off",
                m["records_per_server_cpu_s"] / off["records_per_server_cpu_s"], "x", "",
                "torchyard's process only: routes and exporter threads"),
            Row("tracking", f"POST p99 {label} / off", m["p99_ms"] / off["p99_ms"], "x"),
        ]
    rows += [
        Row("tracking", "stored → in MLflow p50", percentile(delays, 50), "s", "",
            f"{count} records at {LATENCY_RATE:g}/s, read back every {POLL_S * 1000:g} ms"),
        Row("tracking", "stored → in MLflow p99", percentile(delays, 99), "s", "<= 2 s"),
    ]
    return rows


if __name__ == "__main__":
    import sys

    for row in run("--smoke" in sys.argv):
        print(row)
