"""Checkpoints: the worker.checkpoint API and a real 2-rank torchrun resume (no mocks)."""

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from pydantic import ValidationError

from tests.worker.rungroup import run_rank_group
from torchyard_contract.spec import DatasetName, JobSpec, OptimizerName
from worker.checkpoint import checkpoint_name, list_checkpoints, load_latest, save_checkpoint


def test_save_names_atomically_and_round_trips(tmp_path: Path) -> None:
    directory = tmp_path / "ckpt"
    path = save_checkpoint(directory, 5, {"w": torch.arange(3), "note": "x"}, keep=2)
    assert path == directory / "epoch-000005.pt" == directory / checkpoint_name(5)
    assert sorted(p.name for p in directory.iterdir()) == ["epoch-000005.pt"]  # no temp left
    state = load_latest(directory)
    assert state is not None and state["epoch"] == 5 and state["note"] == "x"
    assert torch.equal(state["w"], torch.arange(3))


def test_keep_last_k_and_stale_temps_removed(tmp_path: Path) -> None:
    (tmp_path / ".epoch-000009-abc.tmp").write_bytes(b"partial")  # a crashed saver's temp
    for epoch in range(1, 6):
        save_checkpoint(tmp_path, epoch, {"e": epoch}, keep=3)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "epoch-000003.pt",
        "epoch-000004.pt",
        "epoch-000005.pt",
    ]
    assert [e for e, _ in list_checkpoints(tmp_path)] == [3, 4, 5]


def test_load_latest_ignores_temps_and_falls_back_from_corrupt(tmp_path: Path) -> None:
    assert load_latest(tmp_path / "missing") is None
    assert load_latest(tmp_path) is None
    save_checkpoint(tmp_path, 2, {"v": 2}, keep=5)
    save_checkpoint(tmp_path, 3, {"v": 3}, keep=5)
    (tmp_path / ".epoch-000007-x.tmp").write_bytes(b"in progress")
    (tmp_path / "epoch-000004.pt").write_bytes(b"not a torch file")  # corrupt newest
    newest = tmp_path / "epoch-000003.pt"
    newest.write_bytes(newest.read_bytes()[:20])  # truncated second-newest
    state = load_latest(tmp_path)
    assert state is not None and state["epoch"] == 2 and state["v"] == 2


def test_save_rejects_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="keep"):
        save_checkpoint(tmp_path, 1, {}, keep=0)
    with pytest.raises(ValueError, match="epoch"):
        save_checkpoint(tmp_path, -1, {}, keep=1)


def test_spec_bounds() -> None:
    spec = JobSpec()
    assert (spec.checkpoint_every, spec.keep_checkpoints) == (1, 2)
    JobSpec(checkpoint_every=0, keep_checkpoints=100)
    for bad in ({"checkpoint_every": -1}, {"checkpoint_every": 100_001},
                {"keep_checkpoints": 0}, {"keep_checkpoints": 101}):  # fmt: skip
        with pytest.raises(ValidationError):
            JobSpec(**bad)


def _spool(run_dir: Path, rank: int) -> list[dict[str, Any]]:
    path = run_dir / "spool" / f"rank-{rank}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_real_two_rank_resume_is_exact(tmp_path: Path, warm_ranks: str) -> None:
    # Adam: its moment estimates are optimizer state that a resume must restore exactly.
    spec = JobSpec(
        name="ckpt", dataset=DatasetName.synthetic, epochs=3, batch_size=32,
        synthetic_samples=256, optimizer=OptimizerName.adam, lr=0.01, seed=3,
    )  # fmt: skip
    run = tmp_path / "run"
    run_rank_group(run, spec, warm_ranks)
    files = list_checkpoints(run / "checkpoints")
    assert len(files) == spec.keep_checkpoints
    assert [e for e, _ in files] == [2, 3]
    before = {rank: len(_spool(run, rank)) for rank in (0, 1)}

    run_rank_group(run, spec.model_copy(update={"epochs": 5}), warm_ranks)
    assert [e for e, _ in list_checkpoints(run / "checkpoints")] == [4, 5]
    resumed: dict[int, dict[int, float]] = {}
    for rank in (0, 1):
        new = _spool(run, rank)[before[rank] :]  # the spool is appended to across runs
        assert {r["epoch"] for r in new if r["name"] == "loss"} == {4, 5}
        marks = [(r["epoch"], r["value"]) for r in new if r["name"] == "resumed_from_epoch"]
        assert marks == [(4, 3)]
        resumed[rank] = {r["epoch"]: r["value"] for r in new if r["name"] == "loss"}

    straight = tmp_path / "straight"
    run_rank_group(straight, spec.model_copy(update={"epochs": 5}), warm_ranks)
    for rank in (0, 1):
        losses = {r["epoch"]: r["value"] for r in _spool(straight, rank) if r["name"] == "loss"}
        assert not any(r["name"] == "resumed_from_epoch" for r in _spool(straight, rank))
        # CPU/gloo with the same weights, optimizer moments, RNG and shuffle is
        # deterministic, so this is equal in practice; 1e-6 only guards float printing.
        assert resumed[rank][4] == pytest.approx(losses[4], abs=1e-6, rel=0)
        assert resumed[rank][5] == pytest.approx(losses[5], abs=1e-6, rel=0)

    # Nothing left to train: exits 0, trains and reports nothing more.
    lines = {rank: len(_spool(run, rank)) for rank in (0, 1)}
    run_rank_group(run, spec.model_copy(update={"epochs": 4}), warm_ranks)
    assert all(len(_spool(run, rank)) == lines[rank] for rank in (0, 1))
    assert [e for e, _ in list_checkpoints(run / "checkpoints")] == [4, 5]
