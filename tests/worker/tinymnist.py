"""A tiny MNIST in torchvision's raw format (IDX files), for jobs that read a dataset from a local
root (tests/worker/, tests/slurm/test_slurm.py)."""

import struct
from pathlib import Path

import numpy as np


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
