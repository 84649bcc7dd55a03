"""torchvision datasets from a local root: a tiny MNIST written as IDX files, and a missing root."""

import struct
from pathlib import Path

import numpy as np

from tests.conftest import LiveServer


def _write_idx(path: Path, array: np.ndarray) -> None:
    # IDX: magic (0, 0, dtype 0x08 = ubyte, ndim), then big-endian dims, then the bytes.
    header = struct.pack(">BBBB", 0, 0, 0x08, array.ndim)
    dims = struct.pack(f">{array.ndim}I", *array.shape)
    path.write_bytes(header + dims + array.astype(np.uint8).tobytes())


def write_tiny_mnist(root: Path, train: int = 128, test: int = 32) -> None:
    """A learnable MNIST-format set: class k images have a bright row k."""
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for prefix, n in (("train", train), ("t10k", test)):
        labels = rng.integers(0, 10, size=n)
        images = rng.integers(0, 40, size=(n, 28, 28))
        for i, k in enumerate(labels):
            images[i, 2 * k + 4, :] = 255
        _write_idx(raw / f"{prefix}-images-idx3-ubyte", images)
        _write_idx(raw / f"{prefix}-labels-idx1-ubyte", labels)


def test_mnist_from_local_root_trains(live_server: LiveServer, tmp_path: Path) -> None:
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


def test_missing_root_fails_with_reason_naming_the_path(live_server: LiveServer,
                                                         tmp_path: Path) -> None:
    missing = tmp_path / "no-such-dir"
    spec = {"dataset": "fashion_mnist", "dataset_root": str(missing), "epochs": 1,
            "nproc_per_node": 1}
    with live_server.client() as c:
        job_id = c.post("/jobs", json=spec).json()["id"]
    job = live_server.wait_for(job_id, {"failed"}, timeout_s=120)
    assert str(missing) in job["reason"] and "fashion_mnist" in job["reason"], job["reason"]
