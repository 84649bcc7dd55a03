"""Jobs that run as their team's Unix user on the real Slurm 22.05 cluster (``tests/slurmcluster.py``;
issue 46 item 6, docs/slurm.md): the domain's launch with a ``RunAs`` hands the run directory to
the user and the Slurm executor submits with ``sbatch --uid --gid`` (as root), so the attempt
loop on the batch host and the ranks on both nodes run as that user; another user reads none of
the run directory; the server (root) reads the outputs."""

import grp
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from service.domain.loop.context import LoopContext
from service.domain.loop.launch import RunStarter
from service.domain.queue.inventory import Inventory
from service.executor.slurm import SlurmExecutor
from service.executor.slurmcli import SlurmCli
from service.settings import Settings
from tests.slurmcluster import SlurmCluster
from tests.unixusers import python_for_users, reachable, read_as, users_or_skip
from torchyard_contract.childenv import environ_for_children
from torchyard_contract.launch import RunAs
from torchyard_contract.rundir import RunDir
from torchyard_contract.safefile import read_bytes, read_tail
from torchyard_contract.spec import JobSpec

pytestmark = pytest.mark.slow

# Each rank says what it runs as and where, then keeps running until cancelled.
PROBE = """\
import json, os, socket, time
rank = os.environ["RANK"]
info = {"resuid": os.getresuid(), "resgid": os.getresgid(), "groups": os.getgroups(),
        "node": os.environ.get("SLURMD_NODENAME"), "pid": os.getpid()}
out = os.environ["TORCHYARD_OUTPUT_DIR"]
with open(os.path.join(out, f".ids-{rank}.tmp"), "w") as f:
    json.dump(info, f)
os.replace(os.path.join(out, f".ids-{rank}.tmp"), os.path.join(out, f"ids-{rank}.json"))
time.sleep(600)
"""


@pytest.fixture(scope="module")
def users() -> Iterator[tuple[RunAs, RunAs]]:
    with users_or_skip("a", "b") as (a, b):
        yield a, b


def test_a_slurm_job_runs_as_its_user_on_every_node(
    users: tuple[RunAs, RunAs], slurm: SlurmCluster, tmp_path: Path,
) -> None:
    a, b = users
    python = python_for_users(tmp_path / "python", a)
    slurm.cancel_all()
    reachable(tmp_path)
    reachable(slurm.conf.parent)  # the users' srun reads slurm.conf and reaches munge's socket
    scripts = tmp_path / "scripts"
    scripts.mkdir(mode=0o755)
    (scripts / "probe.py").write_text(PROBE)
    settings = Settings(home=tmp_path / "home", script_dirs=str(scripts), stack_sampler="off",
                        stop_grace_s=2, python_executable=str(python))
    server_env = {**environ_for_children(os.environ), **slurm.env}
    executor = SlurmExecutor(SlurmCli(env=server_env), python=str(python),
                             server_env=server_env, stop_grace_s=2)
    ctx = LoopContext(
        settings=settings, sessions=None, loop_sessions=None, read_sessions=None,  # type: ignore[arg-type]
        inventory=Inventory(gpus=(), cpu_slots=2), executor=executor, lease=None,  # type: ignore[arg-type]
        api_url="http://127.0.0.1:9", queue_changed=lambda: None, set_waiting=lambda _: None)
    spec = JobSpec.model_validate({"entrypoint": "probe.py", "nnodes": 2, "nproc_per_node": 1,
                                   "device": "cpu"})
    ref = RunStarter(ctx).start_run(1, "job-token-not-a-secret", spec, None, run_as=a)
    try:
        run = RunDir.for_job(settings.runs_dir, 1)
        deadline = time.monotonic() + 180
        ids: list[dict] = []
        while len(ids) < 2:
            assert time.monotonic() < deadline, read_tail(run.logs_dir / "batch.log", 4000)
            ids = [json.loads(raw) for r in range(2)
                   if (raw := read_bytes(run.output_dir / f"ids-{r}.json", 1 << 20)) is not None]
            time.sleep(0.5)
        assert sorted(i["node"] for i in ids) == ["n1", "n2"], ids  # a rank on each node
        for rank in ids:
            assert rank["resuid"] == [a.uid] * 3 and rank["resgid"] == [a.gid] * 3, rank
            assert set(rank["groups"]) <= {a.gid}, rank  # Slurm's initgroups: the user's own
        job = slurm.run("scontrol", "show", "job", ref, check=False).stdout
        group = grp.getgrgid(a.gid).gr_name
        assert f"UserId={a.user}({a.uid})" in job and f"GroupId={group}({a.gid})" in job, job
        assert run.root.stat().st_uid == a.uid and run.root.stat().st_mode & 0o777 == 0o700
        by_b = read_as(b, {"run": str(run.root), "outputs": str(run.output_dir / "ids-0.json"),
                           "batch_log": str(run.logs_dir / "batch.log")}, python)
        assert all(str(v).startswith("PermissionError") for v in by_b.values()), by_b
        assert executor.describe({1: ref})[1].phase.value == "running"
    finally:
        executor.cancel(ref, grace_s=2)
