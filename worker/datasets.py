"""Datasets as ready tensors, so the training loop only indexes memory.

Contract: :func:`load_dataset` returns a :class:`Splits` whose images are float32
``[N, C, H, W]`` normalized per channel with train-split statistics, and labels int64
``[N]``. Torchvision datasets are read from ``root`` (downloaded there only when
``download`` is true); missing files raise :class:`DatasetUnavailable` naming the dataset
and the path.
"""

import gzip
import importlib.util
from dataclasses import dataclass
from pathlib import Path

import torch

from torchyard_contract.spec import DatasetName, JobSpec, ModelName

NUM_CLASSES = 10
TEST_FRACTION = 0.2
# The digits split uses a fixed seed, not the job's, so test accuracy is comparable
# across jobs with different seeds.
DIGITS_SPLIT_SEED = 0


class DatasetUnavailable(RuntimeError):
    """A dataset's files are missing and could not (or may not) be downloaded."""


@dataclass(frozen=True)
class Splits:
    """Train and (optional) test tensors plus the shape facts the model needs."""

    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor | None
    test_y: torch.Tensor | None
    num_classes: int

    @property
    def input_shape(self) -> tuple[int, int, int]:
        """(C, H, W) of one sample."""
        c, h, w = self.train_x.shape[1:]
        return (int(c), int(h), int(w))


def load_dataset(spec: JobSpec, root: Path) -> Splits:
    """Load ``spec.dataset``; ``root`` is used only by torchvision datasets."""
    if spec.dataset is DatasetName.digits:
        return _digits()
    if spec.dataset is DatasetName.synthetic:
        shape = (3, 32, 32) if spec.model is ModelName.resnet18 else (1, 8, 8)
        return _synthetic(spec.synthetic_samples, shape, spec.seed)
    return _torchvision(spec.dataset, root, spec.download)


def _normalize(
    train_x: torch.Tensor, test_x: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    # Per-channel statistics of the training split only, so no test information leaks.
    mean = train_x.mean(dim=(0, 2, 3), keepdim=True)
    std = train_x.std(dim=(0, 2, 3), keepdim=True).clamp_min(1e-6)
    train_x = (train_x - mean) / std
    return train_x, None if test_x is None else (test_x - mean) / std


def _split(x: torch.Tensor, y: torch.Tensor, seed: int) -> Splits:
    generator = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(x), generator=generator)
    n_test = max(1, int(len(x) * TEST_FRACTION))
    train, test = order[:-n_test], order[-n_test:]
    train_x, test_x = _normalize(x[train], x[test])
    return Splits(train_x, y[train], test_x, y[test], NUM_CLASSES)


def digits_file() -> Path | None:
    """scikit-learn's copy of the UCI digits, the file ``load_digits`` reads, found without
    importing scikit-learn (its import is ~0.9 CPU s, more than the rest of a short job's
    start); None where this scikit-learn keeps it elsewhere."""
    spec = importlib.util.find_spec("sklearn")  # a top-level find runs none of its code
    for root in (spec.submodule_search_locations or []) if spec is not None else []:
        path = Path(root) / "datasets" / "data" / "digits.csv.gz"
        if path.is_file():
            return path
    return None


def digits_arrays() -> tuple[torch.Tensor, torch.Tensor]:
    """The 1797 digits as float32 images ``[N, 8, 8]`` and int64 labels, as ``load_digits``
    returns them: read from its file (rows of 64 pixels then the label), else through it."""
    import numpy as np

    path = digits_file()
    if path is None:
        from sklearn.datasets import load_digits

        bunch = load_digits()
        images, labels = bunch.images, bunch.target
    else:
        with gzip.open(path, "rt", encoding="utf-8") as rows:
            data = np.loadtxt(rows, delimiter=",")
        images, labels = data[:, :-1].reshape(-1, 8, 8), data[:, -1]
    return (torch.tensor(images, dtype=torch.float32),
            torch.tensor(labels.astype(np.int64)))


def _digits() -> Splits:
    images, labels = digits_arrays()
    return _split(images.unsqueeze(1), labels, DIGITS_SPLIT_SEED)  # [N, 1, 8, 8]


def _synthetic(samples: int, shape: tuple[int, int, int], seed: int) -> Splits:
    """Gaussian clusters around one random centre per class: learnable, deterministic."""
    generator = torch.Generator().manual_seed(seed)
    centres = torch.randn(NUM_CLASSES, *shape, generator=generator)
    y = torch.randint(0, NUM_CLASSES, (samples,), generator=generator)
    x = centres[y] + torch.randn(samples, *shape, generator=generator)
    return _split(x, y, seed)


def _torchvision(name: DatasetName, root: Path, download: bool) -> Splits:
    from torchvision import datasets

    cls = {
        DatasetName.mnist: datasets.MNIST,
        DatasetName.fashion_mnist: datasets.FashionMNIST,
        DatasetName.cifar10: datasets.CIFAR10,
    }[name]
    try:
        train = cls(str(root), train=True, download=download)
        test = cls(str(root), train=False, download=download)
    except Exception as exc:  # torchvision raises RuntimeError, OSError, URLError...
        hint = (
            "put the files there or set download: true" if not download else "check network access"
        )
        raise DatasetUnavailable(
            f"{name.value} not found under {root} (download: {str(download).lower()}); {hint}: {exc}"
        ) from exc
    train_x, train_y = _as_tensors(train.data, train.targets)
    test_x, test_y = _as_tensors(test.data, test.targets)
    train_x, test_x = _normalize(train_x, test_x)
    return Splits(train_x, train_y, test_x, test_y, NUM_CLASSES)


def _as_tensors(data: object, targets: object) -> tuple[torch.Tensor, torch.Tensor]:
    # MNIST-style: uint8 tensor [N, H, W]; CIFAR: numpy uint8 [N, H, W, C].
    images = data if isinstance(data, torch.Tensor) else torch.from_numpy(data)  # type: ignore[arg-type]
    images = images.unsqueeze(1) if images.ndim == 3 else images.permute(0, 3, 1, 2)
    labels = torch.as_tensor(targets, dtype=torch.int64)
    return images.float().div_(255).contiguous(), labels
