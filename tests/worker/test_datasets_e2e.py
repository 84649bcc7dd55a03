"""torchvision datasets from a local root: a tiny MNIST written as IDX files, and a missing root."""

from pathlib import Path

from tests.conftest import LiveServer
from tests.worker.tinymnist import write_tiny_mnist


def test_mnist_from_local_root_trains(shared_server: LiveServer, tmp_path: Path) -> None:
    live_server = shared_server
    root = tmp_path / "mnist-root"
    write_tiny_mnist(root)
    spec = {"model": "cnn", "dataset": "mnist", "dataset_root": str(root), "download": False,
            "epochs": 2, "batch_size": 16, "nproc_per_node": 2}
    with live_server.client() as c:
        job_id = c.post("/jobs", json=spec).json()["id"]
        live_server.wait_for(job_id, {"succeeded"}, timeout_s=180)
        items = c.get(f"/jobs/{job_id}/metrics", params={"name": "loss"}).json()["items"]
        acc = c.get(f"/jobs/{job_id}/metrics", params={"name": "test_accuracy"}).json()["items"]
    assert {(i["rank"], i["epoch"]) for i in items} == {(r, e) for r in (0, 1) for e in (1, 2)}
    assert acc and all(0.0 <= i["value"] <= 1.0 for i in acc)


def test_missing_root_fails_with_reason_naming_the_path(shared_server: LiveServer,
                                                         tmp_path: Path) -> None:
    live_server = shared_server
    missing = tmp_path / "no-such-dir"
    spec = {"dataset": "fashion_mnist", "dataset_root": str(missing), "epochs": 1,
            "nproc_per_node": 1}
    with live_server.client() as c:
        job_id = c.post("/jobs", json=spec).json()["id"]
    job = live_server.wait_for(job_id, {"failed"}, timeout_s=120)
    assert str(missing) in job["reason"] and "fashion_mnist" in job["reason"], job["reason"]
