"""The classic MNIST DDP script (``distributed_train.py``), made runnable anywhere.

Compared with the usual tutorial version it picks gloo on CPU and NCCL on GPU, takes the device
from ``LOCAL_RANK`` (not the global rank), reads the dataset from ``--data-root`` (downloads only
with ``--download``, once per node), reports through the torchyard SDK, and checkpoints each
epoch so a restarted attempt, or a job with ``resume_from``, continues where it stopped::

    torchrun --nproc-per-node=2 examples/mnist_ddp.py --data-root ./data --download --epochs 2

As a torchyard job (with this file in a ``TORCHYARD_SCRIPT_DIRS`` directory)::

    {"entrypoint": "mnist_ddp.py", "nproc_per_node": 2, "max_restarts": 1,
     "args": ["--data-root", "/data", "--epochs", "5"]}

Reports per rank per epoch: ``loss`` (mean of the rank's batch losses), ``test_accuracy``
(full test split, evaluated by every rank on the unwrapped model: no collective), and on a
resumed start ``resumed_from_epoch``. Outside torchyard, checkpoints go to ``./checkpoints``.
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, Subset
from torchvision import datasets, transforms

import worker
from worker import checkpoint


def build_model() -> nn.Module:
    """A small CNN for 1×28×28 digits (the tutorial leaves ``model = ...`` to the reader)."""
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 7 * 7, 10),
    )  # fmt: skip


def load_mnist(root: str, train: bool, download: bool, limit: int | None) -> torch.utils.data.Dataset:
    data = datasets.MNIST(root=root, train=train, download=download, transform=transforms.ToTensor())
    return Subset(data, range(min(limit, len(data)))) if limit else data


@torch.no_grad()
def accuracy(model: nn.Module, loader: DataLoader, device: torch.device) -> float:
    model.eval()
    correct = seen = 0
    for inputs, labels in loader:
        correct += (model(inputs.to(device)).argmax(dim=1) == labels.to(device)).sum().item()
        seen += len(labels)
    model.train()
    return correct / max(seen, 1)


@worker.record
def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data-root", default="./data", help="holds MNIST/raw/*-ubyte")
    parser.add_argument("--download", action="store_true", help="fetch MNIST if missing")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64, help="per rank")
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--limit", type=int, default=None, help="use the first N samples only")
    args = parser.parse_args()

    use_cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if use_cuda else "gloo")
    rank = dist.get_rank()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device(f"cuda:{local_rank}" if use_cuda else "cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    torch.manual_seed(args.seed)

    # One download per node: local rank 0 fetches, the others wait, then everyone reads.
    if args.download and local_rank == 0:
        load_mnist(args.data_root, True, True, None)
        load_mnist(args.data_root, False, True, None)
    if args.download:
        dist.barrier()
    train_set = load_mnist(args.data_root, True, False, args.limit)
    test_set = load_mnist(args.data_root, False, False, args.limit)

    model = build_model().to(device)
    ddp = DistributedDataParallel(model, device_ids=[local_rank] if use_cuda else None)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(ddp.parameters(), lr=args.lr)
    sampler = DistributedSampler(train_set, shuffle=True, seed=args.seed)
    train_loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler)
    test_loader = DataLoader(test_set, batch_size=1024)

    start_epoch = 1
    state = checkpoint.load_latest()  # this job's newest, else the resume_from job's
    if state is not None:
        model.load_state_dict(state["model"])  # in place: the DDP wrapper sees it
        optimizer.load_state_dict(state["optimizer"])
        start_epoch = state["epoch"] + 1
        worker.report(epoch=start_epoch, resumed_from_epoch=state["epoch"])
    worker.ready()  # set-up done: a failure from here on may be retried (max_restarts)

    for epoch in range(start_epoch, args.epochs + 1):
        sampler.set_epoch(epoch)
        running_loss = 0.0
        for inputs, labels in train_loader:
            optimizer.zero_grad()
            loss = criterion(ddp(inputs.to(device)), labels.to(device))
            loss.backward()
            optimizer.step()
            running_loss += loss.item()
            worker.ready()  # heartbeat (at most one file touch a second)
        mean_loss = running_loss / len(train_loader)
        test_accuracy = accuracy(model, test_loader, device)
        print(f"Rank {rank}, Epoch {epoch}, Loss: {mean_loss:.6f}, Accuracy: {test_accuracy:.4f}")
        worker.report(epoch=epoch, loss=mean_loss, test_accuracy=test_accuracy)
        checkpoint.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, epoch)

    dist.barrier()  # neither rank tears gloo down while the other still talks to it
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
