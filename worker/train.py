"""One rank of a DDP training job: ``python -m worker --spec RUN_DIR/spec.json``.

Contract: exits 0 after all epochs; any failure propagates as an exception (non-zero exit,
written to ``TORCHELASTIC_ERROR_FILE`` by ``@record``). After setup (data loaded, model
built) the rank writes an empty ``RUN_DIR/attempts/<attempt>/ready-rank-<rank>``.

Records per rank per epoch (epoch numbers start at 1, ``step`` is null):

* ``loss`` – sum of this rank's batch losses / number of its batches (NaN/Inf reported
  as-is; training continues).
* ``samples`` – samples this rank trained on (its DistributedSampler shard, which pads
  so every rank gets ``ceil(N / world_size)``).
* ``seconds`` – wall time of the training pass (excludes evaluation).
* ``samples_per_s`` – ``samples / seconds``.
* ``test_accuracy`` – fraction correct on the *full* test split, evaluated by every rank
  independently (no collective, so it cannot hang; ranks agree since DDP keeps the
  weights in sync, up to per-rank BatchNorm statistics).

Checkpoints (``RUN_DIR/checkpoints``, see :mod:`worker.checkpoint`): rank 0 saves after epoch
``e`` when ``e % checkpoint_every == 0`` or ``e`` is the last epoch (never when
``checkpoint_every`` is 0): the unwrapped model's and the optimizer's state, the epoch, and
the torch (CPU, and CUDA when used) and ``random`` RNG states. On start every rank loads
the newest readable checkpoint (all ranks are on one host and read the same file, so no
collective is needed) and continues at its epoch + 1; the sampler is seeded from
``spec.seed`` and ``set_epoch(e)`` per epoch, so a resumed run reproduces the uninterrupted
run's shuffles and RNG draws. A resuming rank reports ``resumed_from_epoch`` (value: the
checkpoint's epoch; ``epoch``: the first epoch it trains). A checkpoint at or past
``spec.epochs`` means there is nothing left to train: the rank reports nothing and exits 0.
The RNG states are rank 0's; every rank seeds identically, so they are the same on all.
"""

import argparse
import logging
import os
import random
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DistributedSampler, TensorDataset

from torchyard_contract.placement import backend_for
from torchyard_contract.rundir import RunDir
from torchyard_contract.spec import JobSpec, OptimizerName
from worker import default_reporter
from worker.checkpoint import load_latest, save_checkpoint
from worker.datasets import Splits, load_dataset
from worker.env import WorkerEnv
from worker.heartbeat import Heartbeat
from worker.models import build_model
from worker.stopping import catch_sigterm, should_stop

log = logging.getLogger(__name__)

# Generous because a rank-0 download sits behind a barrier; a dead rank is noticed by
# torchrun long before this fires.
PG_TIMEOUT = timedelta(minutes=30)
EVAL_BATCH = 1024


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m worker")
    parser.add_argument("--spec", type=Path, required=True, help="path to spec.json")
    return parser.parse_args(argv)


@record
def main(argv: list[str] | None = None) -> None:
    """Run one rank to completion; raises on any failure."""
    args = parse_args(argv)
    env = WorkerEnv.current()
    spec = JobSpec.model_validate_json(args.spec.read_text(encoding="utf-8"))
    run_dir = env.run_dir or args.spec.parent
    torch.manual_seed(spec.seed)

    use_cuda = env.device == "cuda" if env.device else torch.cuda.is_available()
    backend = env.backend or backend_for("cuda" if use_cuda else "cpu")
    # A collective stuck past the heartbeat timeout raises instead of hanging forever.
    timeout = (
        timedelta(seconds=max(spec.heartbeat_timeout_s * 2, 60))
        if spec.heartbeat_timeout_s is not None
        else PG_TIMEOUT
    )
    dist.init_process_group(backend, timeout=timeout)
    try:
        _run(spec, env, run_dir, use_cuda)
    finally:
        dist.destroy_process_group()


def _run(spec: JobSpec, env: WorkerEnv, run_dir: Path, use_cuda: bool) -> None:
    if use_cuda:
        device = torch.device(f"cuda:{env.local_rank}")
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")

    splits = _load_data(spec, env, run_dir)
    model = build_model(spec.model, splits.input_shape, splits.num_classes).to(device)
    ddp = (
        DistributedDataParallel(model, device_ids=[env.local_rank])
        if use_cuda
        else DistributedDataParallel(model)
    )
    optimizer = _build_optimizer(spec, ddp)
    train_x, train_y = splits.train_x.to(device), splits.train_y.to(device)
    test = (
        (splits.test_x.to(device), splits.test_y.to(device))
        if splits.test_x is not None and splits.test_y is not None
        else None
    )
    sampler = DistributedSampler(
        TensorDataset(splits.train_x),
        num_replicas=env.world_size,
        rank=env.rank,
        shuffle=True,
        seed=spec.seed,
    )
    reporter = default_reporter()

    heartbeat = Heartbeat(RunDir(run_dir).ready_marker(env.attempt, env.rank))

    checkpoint_dir = RunDir(run_dir).checkpoints_dir
    # Our own checkpoints first (a restarted attempt); else the resume_from job's, if any.
    resumed_from = None
    for directory in (checkpoint_dir, env.resume_dir):
        if directory is not None and resumed_from is None:
            resumed_from = _maybe_resume(directory, model, optimizer, device if use_cuda else None)
    start_epoch = 1 if resumed_from is None else resumed_from + 1
    loss_fn = nn.CrossEntropyLoss()
    catch_sigterm()  # a pause's SIGTERM: stop after this epoch (worker.stopping), not now
    try:
        if resumed_from is not None and start_epoch <= spec.epochs:
            reporter.report(epoch=start_epoch, resumed_from_epoch=resumed_from)
        for epoch in range(start_epoch, spec.epochs + 1):
            sampler.set_epoch(epoch)
            metrics = _train_epoch(
                ddp, optimizer, loss_fn, sampler, train_x, train_y, spec.batch_size, device,
                heartbeat,
            )
            if test is not None:
                metrics["test_accuracy"] = _accuracy(model, *test)
            reporter.report(epoch=epoch, **metrics)
            log.info(
                "epoch %d/%d: loss %.6g, %d samples, %.0f samples/s", epoch, spec.epochs,
                metrics["loss"], metrics["samples"], metrics["samples_per_s"],
            )
            # Paused (worker.stopping: every rank agrees): checkpoint this epoch even when
            # none is due, so the resumed job neither repeats nor skips an epoch.
            pausing = epoch < spec.epochs and should_stop()
            if env.rank == 0 and (pausing or _checkpoint_due(spec, epoch)):
                save_checkpoint(
                    checkpoint_dir,
                    epoch,
                    _checkpoint_state(model, optimizer, device if use_cuda else None),
                    keep=spec.keep_checkpoints,
                )
            if pausing:
                log.info("paused after epoch %d; the resumed job goes on from it", epoch)
                return
        if env.rank == 0 and env.output_dir is not None:
            _save_model(env.output_dir, model)
    finally:
        reporter.close(timeout_s=10.0)


def _save_model(output_dir: Path, model: nn.Module) -> None:
    """The trained weights as ``OUTPUT_DIR/model.pt`` (a state dict; temp file + rename)."""
    output_dir.mkdir(parents=True, exist_ok=True)
    tmp = output_dir / ".model.pt.tmp"
    torch.save(model.state_dict(), tmp)
    os.replace(tmp, output_dir / "model.pt")


def _checkpoint_due(spec: JobSpec, epoch: int) -> bool:
    every = spec.checkpoint_every
    return every > 0 and (epoch % every == 0 or epoch == spec.epochs)


def _checkpoint_state(
    model: nn.Module, optimizer: torch.optim.Optimizer, cuda_device: torch.device | None
) -> dict[str, object]:
    """What a resume needs besides the epoch (added by ``save_checkpoint``)."""
    state: dict[str, object] = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "torch_rng": torch.get_rng_state(),
        "python_rng": random.getstate(),
    }
    if cuda_device is not None:
        state["cuda_rng"] = torch.cuda.get_rng_state(cuda_device)
    return state


def _maybe_resume(
    directory: Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    cuda_device: torch.device | None,
) -> int | None:
    """Load the newest checkpoint into model/optimizer/RNGs; its epoch, or None if none."""
    state = load_latest(directory)
    if state is None:
        return None
    model.load_state_dict(state["model"])  # in place, so the DDP wrapper sees it
    optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["torch_rng"])
    random.setstate(state["python_rng"])
    if cuda_device is not None and state.get("cuda_rng") is not None:
        torch.cuda.set_rng_state(state["cuda_rng"], cuda_device)
    epoch = int(state["epoch"])
    log.info("resumed from the checkpoint of epoch %d in %s", epoch, directory)
    return epoch


def _load_data(spec: JobSpec, env: WorkerEnv, run_dir: Path) -> Splits:
    root = Path(spec.dataset_root) if spec.dataset_root else run_dir / "data"
    if not spec.download:
        return load_dataset(spec, root)
    # One download per node: local rank 0 fetches, the others wait and then read the files.
    splits = load_dataset(spec, root) if env.local_rank == 0 else None
    dist.barrier()
    return splits if splits is not None else load_dataset(spec, root)


def _build_optimizer(spec: JobSpec, model: nn.Module) -> torch.optim.Optimizer:
    params = model.parameters()
    if spec.optimizer is OptimizerName.sgd:
        return torch.optim.SGD(
            params, lr=spec.lr, momentum=spec.momentum, weight_decay=spec.weight_decay
        )
    if spec.optimizer is OptimizerName.adam:
        return torch.optim.Adam(params, lr=spec.lr, weight_decay=spec.weight_decay)
    return torch.optim.AdamW(params, lr=spec.lr, weight_decay=spec.weight_decay)


def _train_epoch(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    loss_fn: nn.Module,
    sampler: DistributedSampler[object],
    x: torch.Tensor,
    y: torch.Tensor,
    batch_size: int,
    device: torch.device,
    heartbeat: Heartbeat,
) -> dict[str, float]:
    """One pass over this rank's shard; returns loss/samples/seconds/samples_per_s."""
    model.train()
    indices = torch.tensor(list(sampler), dtype=torch.int64, device=device)
    started = time.perf_counter()
    # Summed on-device so there is no host sync per batch; .item() below syncs once.
    loss_sum = torch.zeros((), device=device)
    batches = 0
    for begin in range(0, len(indices), batch_size):
        batch = indices[begin : begin + batch_size]
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(x[batch]), y[batch])
        loss.backward()
        optimizer.step()
        loss_sum += loss.detach()
        batches += 1
        heartbeat.beat()
    mean_loss = loss_sum.item() / max(batches, 1)
    seconds = time.perf_counter() - started
    samples = len(indices)
    return {
        "loss": mean_loss,
        "samples": samples,
        "seconds": seconds,
        "samples_per_s": samples / seconds if seconds > 0 else 0.0,
    }


@torch.no_grad()
def _accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """Fraction correct on (x, y); uses the bare module so no DDP collective runs."""
    model.eval()
    correct = torch.zeros((), dtype=torch.int64, device=x.device)
    for begin in range(0, len(x), EVAL_BATCH):
        logits = model(x[begin : begin + EVAL_BATCH])
        correct += (logits.argmax(dim=1) == y[begin : begin + EVAL_BATCH]).sum()
    return correct.item() / max(len(x), 1)
