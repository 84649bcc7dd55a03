"""The launchers (``service.run.launcher``): what differs between ranks on this host and ranks in
a Slurm allocation, one object each, chosen once by ``--launcher``. The parts that need no
cluster; the whole Slurm path runs in ``tests/slurm/test_slurm.py``."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from service.run import fastexit, ranktee
from service.run.launcher import (
    LAUNCHERS,
    LocalLauncher,
    SlurmLauncher,
    exit_status,
    launcher_for,
)
from service.run.warm import RELAY_PATH
from tests.conftest import REPO_ROOT
from torchyard_contract import envnames as names
from torchyard_contract.launch import LaunchConfig
from torchyard_contract.rundir import RunDir


def _config(**fields: object) -> LaunchConfig:
    base: dict = dict(job_id=7, python=sys.executable, nproc_per_node=1, max_restarts=0,
                      max_runtime_s=None, heartbeat_timeout_s=None, stop_grace_s=1.0,
                      program=["train.py", "--lr", "0.1"])
    return LaunchConfig(**{**base, **fields})


def test_the_launcher_is_chosen_once_by_name() -> None:
    assert LAUNCHERS == ("local", "slurm")
    local = launcher_for("local", "/tmp/warm.sock", None)
    assert isinstance(local, LocalLauncher) and local.warm_socket == "/tmp/warm.sock"
    assert isinstance(launcher_for("slurm", "/tmp/warm.sock"), SlurmLauncher)  # never warm
    with pytest.raises(ValueError, match="one of local, slurm"):
        launcher_for("kubernetes")


def test_local_ranks_cold_and_warm(tmp_path: Path) -> None:
    run, config = RunDir(tmp_path), _config()
    cold = LocalLauncher()
    assert cold.rank_program(run, config) == fastexit.wrap(("train.py", "--lr", "0.1"))
    assert cold.attempt_env() == {}
    warm = LocalLauncher("/tmp/warm.sock")
    assert warm.rank_program(run, config) == (str(RELAY_PATH), "/tmp/warm.sock", "train.py",
                                              "--lr", "0.1")
    assert warm.attempt_env() == {names.STACKS_TRACER: str(os.getpid())}
    assert cold.torchrun_logs(tmp_path) == [tmp_path / "torchrun.log"]
    assert (cold.excludes_nodes, cold.claim_fields(), cold.exit_status(3)) == (False, {}, 0)


def test_slurm_ranks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    slurm = SlurmLauncher()
    assert slurm.rank_program(RunDir(tmp_path), _config()) == fastexit.wrap(
        ("train.py", "--lr", "0.1"))
    for name in ("node-1.log", "node-0.log", "srun.log"):
        (tmp_path / name).write_text("")
    assert slurm.torchrun_logs(tmp_path) == [
        tmp_path / "node-0.log", tmp_path / "node-1.log", tmp_path / "srun.log"]
    assert slurm.excludes_nodes and slurm.tell_pause(RunDir(tmp_path), _config()) is None
    assert [slurm.exit_status(c) for c in (0, 3, 300, -9, None)] == [0, 3, 255, 137, 1]
    assert exit_status(-15) == 143
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert slurm.claim_fields() == {}
    assert slurm.dump_stacks(RunDir(tmp_path), _config()) == (
        [], "not inside a Slurm allocation (SLURM_JOB_ID unset)")
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    assert slurm.claim_fields() == {"slurm_job_id": "4242"}


def test_a_local_pause_reaches_the_rank_program_below_its_tee(tmp_path: Path) -> None:
    """A real rank tee and program below this process: the launcher finds the program (not
    the tee) by its run directory and rank, and SIGTERM ends it as Python's default does."""
    run = RunDir(tmp_path / "run")
    run.prepare()
    ready = tmp_path / "ready"
    program = ("-c", f"import time; open({str(ready)!r}, 'w').close(); time.sleep(120)")
    tee = subprocess.Popen([sys.executable, *ranktee.wrap(run, 1, program)], cwd=REPO_ROOT,
                           env={**os.environ, "RANK": "0"})
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert time.monotonic() < deadline and tee.poll() is None, "the rank never started"
            time.sleep(0.02)
        assert LocalLauncher().tell_pause(run, _config(nproc_per_node=2)) == 1
        assert tee.wait(timeout=60) == -15  # the tee dies of the signal that ended the program
        # Another run's ranks are not this one's.
        assert LocalLauncher().tell_pause(RunDir(tmp_path / "other"), _config()) == 0
    finally:
        tee.kill()
        tee.wait()


def test_local_stacks_say_why_there_are_none(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    assert LocalLauncher().dump_stacks(run, _config(stack_sampler="no-such-sampler")) == (
        [], "the stack sampler 'no-such-sampler' was not found")
    assert LocalLauncher().dump_stacks(run, _config(stack_sampler=None))[1] == (
        "stacks are turned off (TORCHYARD_STACK_SAMPLER is off)")


def test_a_taken_rendezvous_port_is_told_from_torchruns_own_output(tmp_path: Path) -> None:
    """The attempt loop starts an attempt again on another port when torchrun's rendezvous port
    was taken between being found free and being bound (``exitreason.rendezvous_port_taken``):
    told from a real torchrun's output on a port this test holds, and only from what was written
    after the start (``log_sizes``), so an earlier start's clash never makes a later failure one."""
    import socket

    from service.run.exitreason import log_sizes, rendezvous_port_taken

    log = tmp_path / "torchrun.log"
    log.write_bytes(b"an earlier start's output\n")
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        since = log_sizes([log, tmp_path / "not-yet.log"])
        with open(log, "ab") as out:
            done = subprocess.run(
                [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc-per-node=1",
                 "--master-addr=127.0.0.1", f"--master-port={port}", "-m", "never.started"],
                stdout=out, stderr=subprocess.STDOUT, timeout=120, check=False)
    assert done.returncode != 0
    assert rendezvous_port_taken([log, tmp_path / "not-yet.log"], since), log.read_text()[-2000:]
    assert not rendezvous_port_taken([log], log_sizes([log]))  # nothing written since
    later = log_sizes([log])
    with open(log, "ab") as out:  # a later start that fails for a reason of its own
        out.write(b"ModuleNotFoundError: No module named 'never'\n")
    assert not rendezvous_port_taken([log], later)
