"""At least once, and no point twice: the MLflow server stopped mid-job and started again, and
the torchyard server SIGKILLed between sending a batch and recording MLflow's answer (a proxy in
front of MLflow stores the batch and holds its answer: ``tests/tracking/holdproxy.py``) and
started again on the same home. Each time the
run ends up with every record once."""

import time
from collections.abc import Callable

from tests.conftest import ADOPTS_ONLY, LiveServer, every_record, hooks
from tests.fixtures.threadserver import serve_in_thread
from tests.tracking.exports import assert_every_point_once, submit, wait_export
from tests.tracking.holdproxy import HoldProxy
from tests.tracking.mlflowserver import MlflowReader, MlflowServer

QUICK = {"dataset": "synthetic", "synthetic_samples": 64, "batch_size": 32, "device": "cpu",
         "checkpoint_every": 0, "nproc_per_node": 2}


def test_mlflow_down_mid_job_gets_every_point_once_when_it_returns(
    live_server_factory: Callable[..., LiveServer], mlflow_server: MlflowServer,
    mlflow: MlflowReader,
) -> None:
    server = live_server_factory(TORCHYARD_MLFLOW_TRACKING_URI=mlflow_server.url)
    job_id = submit(server, {**QUICK, "epochs": 6, "labels": hooks(epoch_sleep_s=0.4)})
    deadline = time.monotonic() + 120
    while not every_record(server, job_id):  # exporting while it runs
        assert time.monotonic() < deadline, "no record in 120 s"
        time.sleep(0.2)
    wait_export(server, job_id, terminal=False)
    mlflow_server.stop()
    try:
        job = server.wait_for(job_id, {"succeeded"})
        # Everything stored; the export says why it waits, and the job did not.
        job = wait_export(server, job_id, state="error:")
        assert "cannot reach" in job["mlflow"]["state"]
        assert len({r["epoch"] for r in every_record(server, job_id)}) == 6
    finally:
        mlflow_server.start()
    wait_export(server, job_id)
    run = assert_every_point_once(server, mlflow, job_id)
    assert run["info"]["status"] == "FINISHED"


def test_a_server_killed_between_sending_and_recording_sends_no_point_twice(
    live_server_factory: Callable[..., LiveServer], mlflow_server: MlflowServer,
    mlflow: MlflowReader,
) -> None:
    env = {"TORCHYARD_MLFLOW_TRACKING_URI": mlflow_server.url}
    proxy = HoldProxy(mlflow_server.url)
    with serve_in_thread(proxy.app()) as front:  # type: ignore[arg-type]
        try:
            server = live_server_factory(TORCHYARD_MLFLOW_TRACKING_URI=front.url)
            job_id = submit(server, {**QUICK, "epochs": 2})
            assert proxy.held.wait(120), "the exporter never sent a batch"
            server.proc.kill()  # the batch is in MLflow; that it is was never recorded
            server.proc.wait()
        finally:
            proxy.release()
    restarted = live_server_factory(server.home, server.port, **env, **ADOPTS_ONLY)
    job = wait_export(restarted, job_id)
    assert job["state"] == "succeeded", job["reason"]
    log = restarted.log.read_text()
    assert "after an unknown outcome: 0 of" in log, log[-3000:]  # all there already
    run = assert_every_point_once(restarted, mlflow, job_id)
    assert run["info"]["status"] == "FINISHED"
