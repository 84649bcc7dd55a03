"""The smallest torchyard script job: DDP on generated data, one ``worker.report`` per epoch.

Runs unchanged under plain torchrun (the SDK is then a no-op with one warning)::

    torchrun --nproc-per-node=2 examples/minimal_ddp.py --epochs 3

and as a torchyard job (``"entrypoint": "minimal_ddp.py"`` with this file in a script
directory). gloo on CPU, NCCL on GPU, device from ``LOCAL_RANK``. Each rank prints and reports
the mean of its batch losses per epoch; with the same ``--seed`` both runs give the same losses.
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import worker


@worker.record
def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--samples", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    use_cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if use_cuda else "gloo")
    rank = dist.get_rank()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device(f"cuda:{local_rank}" if use_cuda else "cpu")
    if use_cuda:
        torch.cuda.set_device(device)

    # The same data and initial weights on every rank and in every run.
    torch.manual_seed(args.seed)
    x = torch.randn(args.samples, 16)
    y = (x @ torch.randn(16, 4)).argmax(dim=1)
    dataset = TensorDataset(x, y)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).to(device)
    ddp = DistributedDataParallel(model, device_ids=[local_rank] if use_cuda else None)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=args.lr)
    loss_fn = nn.CrossEntropyLoss()
    sampler = DistributedSampler(dataset, shuffle=True, seed=args.seed)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)

    for epoch in range(1, args.epochs + 1):
        sampler.set_epoch(epoch)
        total, batches = 0.0, 0
        for inputs, labels in loader:
            optimizer.zero_grad()
            loss = loss_fn(ddp(inputs.to(device)), labels.to(device))
            loss.backward()
            optimizer.step()
            total += loss.item()
            batches += 1
        mean_loss = total / batches
        print(f"rank {rank} epoch {epoch} loss {mean_loss:.10f}", flush=True)
        worker.report(epoch=epoch, loss=mean_loss)

    # Neither rank tears gloo down while the other still talks to it (on a loaded host a rank
    # that got there first can abort the other: "terminate called without an active exception").
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
