"""Trainer throughput: the built-in epoch loop against the seed document's loop, same model and data.

Data: MNIST-format files (idx, 28x28 uint8) made locally from scikit-learn's 8x8 digits,
upscaled and jittered; no download. Both sides read the same files with the same model,
optimizer, batch size (64) and seed, on one CPU thread (what a 1-slot CPU rank gets):

* built-in: ``worker.datasets.load_dataset`` (tensors loaded once) and ``worker.train``'s epoch
  loop (index tensors, loss summed on the device);
* seed: ``torchvision.datasets.MNIST(transform=ToTensor())`` + ``DistributedSampler`` +
  ``DataLoader(batch_size=64)``, ``loss.item()`` per batch, as in the seed document.

Epochs alternate between the two so machine load hits both alike. Goal: >= 2x samples/s on CPU.
"""

import struct
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench.common import Row

GOAL = ">= 2x on CPU"
BATCH = 64
LR = 0.05


def write_mnist(root: Path, train: int, test: int, seed: int = 0) -> None:
    """MNIST idx files under ``root/MNIST/raw`` from upscaled, shifted, noisy sklearn digits."""
    import torch
    import torch.nn.functional as F
    from sklearn.datasets import load_digits

    digits = load_digits()
    base = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    big = F.interpolate(base, size=(20, 20), mode="bilinear", align_corners=False)
    gen = torch.Generator().manual_seed(seed)
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for prefix, n in (("train", train), ("t10k", test)):
        pick = torch.randint(0, len(big), (n,), generator=gen)
        images = torch.zeros(n, 28, 28)
        offsets = torch.randint(0, 9, (n, 2), generator=gen)
        for i in range(n):
            dy, dx = offsets[i].tolist()
            images[i, dy : dy + 20, dx : dx + 20] = big[pick[i], 0]
        images = (images + 0.1 * torch.rand(n, 28, 28, generator=gen)).clamp(0, 1)
        pixels = (images * 255).to(torch.uint8).numpy().tobytes()
        labels = torch.tensor(digits.target)[pick].to(torch.uint8).numpy().tobytes()
        (raw / f"{prefix}-images-idx3-ubyte").write_bytes(struct.pack(">IIII", 2051, n, 28, 28) + pixels)
        (raw / f"{prefix}-labels-idx1-ubyte").write_bytes(struct.pack(">II", 2049, n) + labels)


def builtin_epochs(root: Path, model_name: str, workdir: Path) -> Callable[[int], tuple[int, float]]:
    """The built-in trainer, prepared; the returned function trains one epoch -> (samples, s)."""
    import torch
    from torch import nn
    from torch.utils.data import DistributedSampler, TensorDataset

    from torchyard_contract.spec import JobSpec
    from worker.datasets import load_dataset
    from worker.heartbeat import Heartbeat
    from worker.models import build_model
    from worker.train import _train_epoch

    spec = JobSpec(dataset="mnist", model=model_name, dataset_root=str(root), batch_size=BATCH)
    torch.manual_seed(0)
    splits = load_dataset(spec, root)
    model = build_model(spec.model, splits.input_shape, splits.num_classes)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    sampler = DistributedSampler(
        TensorDataset(splits.train_x), num_replicas=1, rank=0, shuffle=True, seed=0
    )
    heartbeat = Heartbeat(workdir / "ready-rank-0")
    loss_fn = nn.CrossEntropyLoss()
    device = torch.device("cpu")

    def epoch(e: int) -> tuple[int, float]:
        sampler.set_epoch(e)
        m = _train_epoch(model, optimizer, loss_fn, sampler, splits.train_x, splits.train_y,
                         BATCH, device, heartbeat)
        return int(m["samples"]), float(m["seconds"])

    return epoch


def seed_epochs(root: Path, model_name: str) -> Callable[[int], tuple[int, float]]:
    """The seed document's loop (single rank), prepared; same contract as ``builtin_epochs``."""
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, DistributedSampler
    from torchvision import datasets, transforms

    from worker.models import build_model

    torch.manual_seed(0)
    transform = transforms.Compose([transforms.ToTensor()])
    train_dataset = datasets.MNIST(root=str(root), train=True, download=False, transform=transform)
    sampler = DistributedSampler(train_dataset, num_replicas=1, rank=0, shuffle=True, seed=0)
    loader = DataLoader(dataset=train_dataset, batch_size=BATCH, sampler=sampler)
    model = build_model(model_name, (1, 28, 28), 10)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)

    def epoch(e: int) -> tuple[int, float]:
        sampler.set_epoch(e)
        model.train()
        started = time.perf_counter()
        running_loss = 0.0
        samples = 0
        for inputs, labels in loader:
            optimizer.zero_grad()
            loss = criterion(model(inputs), labels)
            loss.backward()
            optimizer.step()
            running_loss += loss.item()
            samples += len(labels)
        return samples, time.perf_counter() - started

    return epoch


def compare(root: Path, workdir: Path, model_name: str, epochs: int) -> tuple[float, float]:
    """(built-in samples/s, seed samples/s) over ``epochs`` alternating epochs after a warm-up."""
    builtin, seed = builtin_epochs(root, model_name, workdir), seed_epochs(root, model_name)
    builtin(0), seed(0)
    totals = {"builtin": [0, 0.0], "seed": [0, 0.0]}
    for e in range(1, epochs + 1):
        for name, fn in (("builtin", builtin), ("seed", seed)):
            n, s = fn(e)
            totals[name][0] += n
            totals[name][1] += s
    return (totals["builtin"][0] / totals["builtin"][1], totals["seed"][0] / totals["seed"][1])


def run(smoke: bool) -> list[Row]:
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a CPU job's rank gets one thread per slot (OMP_NUM_THREADS=1)
    cases = [("mlp", 600, 1), ("cnn", 128, 1)] if smoke else [("mlp", 12_000, 3), ("cnn", 3_000, 2)]
    rows: list[Row] = []
    try:
        for model_name, samples, epochs in cases:
            with tempfile.TemporaryDirectory(prefix="bench-trainer-") as tmp:
                root = Path(tmp)
                write_mnist(root, samples, max(100, samples // 6))
                ours, theirs = compare(root, root / "run", model_name, epochs)
            note = f"{samples:,} 28x28 samples, batch {BATCH}, {epochs} epochs each, 1 thread"
            rows += [
                Row("trainer", f"{model_name}: built-in samples/s", ours, "samples/s", "", note),
                Row("trainer", f"{model_name}: seed loop samples/s", theirs, "samples/s"),
                Row("trainer", f"{model_name}: ratio built-in / seed", ours / theirs, "x", GOAL),
            ]
    finally:
        torch.set_num_threads(threads)
    return rows


if __name__ == "__main__":
    import sys

    for row in run("--smoke" in sys.argv):
        print(row)
