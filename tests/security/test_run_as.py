"""Jobs that run as their team's Unix user (issue 46 item 6; docs/security.md, "Run as the team's
Unix user"), on real processes as root, as CI runs: the domain's launch (``RunStarter.start_run``
with a ``RunAs``) writes and hands over the run directory, the local executor starts the attempt
loop as the user, torchrun and both ranks of a package job run as that user with its primary
group and no other (warm ranks on: from that user's own warm server; off: cold), hold a secret,
keep running; another user reads neither the run directory, the outputs, the spool, the
package checkout nor the ranks' ``/proc/<pid>/environ``; the server (root) still reads the
outputs and logs, and never through a link the job planted."""

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from service.domain.files.artifacts import ArtifactNotFound, job_uid, open_artifact
from service.domain.files.packages import package_store
from service.domain.loop.context import LoopContext
from service.domain.loop.launch import RunStarter
from service.domain.queue.inventory import Inventory
from service.domain.queue.placement import Placement
from service.executor.base import Phase
from service.executor.local import LocalExecutor
from service.executor.warmpool import WarmPool
from service.settings import Settings
from tests.conftest import gone
from tests.unixusers import python_for_users, reachable, read_as, skip_or_fail, users_or_skip
from torchyard_contract.launch import LaunchConfig, RunAs
from torchyard_contract.rundir import RunDir
from torchyard_contract.safefile import read_bytes, read_tail
from torchyard_contract.spec import JobSpec

pytestmark = pytest.mark.slow

SECRET = "run-as-secret-" + hashlib.sha256(b"test_run_as").hexdigest()[:16]
WARM_PRELOAD = ["torch", "torch.distributed", "torch.distributed.launcher.api"]
READY_TIMEOUT_S = 240.0  # a user's warm server imports torch on a loaded 2-core machine

# The rank program (a package's train.py): what it runs as, written where the job keeps its
# outputs; rank 0 also plants links for the server to (not) follow; then it keeps running.
PROBE = """\
import json, os, sys, time
rank = os.environ["RANK"]
out, run = os.environ["TORCHYARD_OUTPUT_DIR"], os.environ["TORCHYARD_RUN_DIR"]
os.makedirs(os.path.join(run, "spool"), exist_ok=True)  # as the SDK's reporter spools records
with open(os.path.join(run, "spool", f"rank-{rank}.jsonl"), "a") as f:
    f.write(json.dumps({"rank": int(rank), "name": "probe", "value": 1.0}) + "\\n")
if rank == "0":
    os.symlink(os.environ["ROOT_ONLY"], os.path.join(out, "leak.txt"))
    os.symlink(os.path.dirname(os.environ["ROOT_ONLY"]), os.path.join(run, "linked"))
fds = {}
for fd in os.listdir("/proc/self/fd"):
    try:
        fds[fd] = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        pass
info = {"resuid": os.getresuid(), "resgid": os.getresgid(), "groups": os.getgroups(),
        "pid": os.getpid(), "warm": "torch" in sys.modules, "home": os.environ.get("HOME"),
        "user": os.environ.get("USER"), "secret": bool(os.environ.get("MY_SECRET")), "fds": fds}
tmp = os.path.join(out, f".ids-{rank}.tmp")
with open(tmp, "w") as f:
    json.dump(info, f)
os.replace(tmp, os.path.join(out, f"ids-{rank}.json"))
print(f"rank {rank} runs as uid {os.getuid()}", flush=True)
time.sleep(600)
"""


@pytest.fixture(scope="module")
def users() -> Iterator[tuple[RunAs, RunAs]]:
    with users_or_skip("a", "b") as (a, b):
        yield a, b


@pytest.fixture(scope="module")
def python(tmp_path_factory: pytest.TempPathFactory, users: tuple[RunAs, RunAs]) -> Path:
    """The interpreter of the jobs (and of the server's side of them: attempt loop, warm server)."""
    return python_for_users(tmp_path_factory.mktemp("python"), users[0])


def _package(settings: Settings) -> str:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        info = tarfile.TarInfo("train.py")
        info.size = len(PROBE)
        tar.addfile(info, io.BytesIO(PROBE.encode()))
    body = buf.getvalue()
    digest = "sha256:" + hashlib.sha256(body).hexdigest()
    store = package_store(settings)
    upload = store.new_upload()
    upload.write_bytes(body)
    store.add(upload, digest, len(body))
    return digest


def _wait_ids(run: RunDir, world: int) -> list[dict]:
    deadline = time.monotonic() + 180
    found: list[dict] = []
    while len(found) < world:
        ended = read_bytes(run.exit_file, 1 << 20)
        assert ended is None, f"{ended!r}: {read_tail(run.rank_output(1, 0), 2000)}"
        assert time.monotonic() < deadline, (run.root / "attempt-loop.log").read_text()
        found = [json.loads(raw) for r in range(world)
                 if (raw := read_bytes(run.output_dir / f"ids-{r}.json", 1 << 20)) is not None]
        time.sleep(0.2)
    return found


def _environ(proc: psutil.Process) -> dict[str, str]:
    try:
        return proc.environ()
    except psutil.Error:
        return {}


def _wait_socket(pool: WarmPool, run_as: RunAs) -> None:
    """Until ``run_as``'s own warm server serves (its first ask starts it)."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while pool.socket_for_launch(run_as)[0] is None:
        assert time.monotonic() < deadline, pool.socket_for_launch(run_as)[1]
        time.sleep(0.5)


@pytest.mark.parametrize("warm", [True, False], ids=["warm", "cold"])
def test_a_job_runs_as_its_users_and_no_other_user_reads_it(
    users: tuple[RunAs, RunAs], python: Path, tmp_path: Path, warm: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    a, b = users
    reachable(tmp_path)
    home = tmp_path / "home"
    root_only = tmp_path / "root-only" / "secret.txt"
    root_only.parent.mkdir(mode=0o700)
    root_only.write_text("root's own")
    secrets = tmp_path / "secrets.json"
    secrets.write_text(json.dumps({"s": SECRET}))
    settings = Settings(home=home, secrets_file=secrets, stack_sampler="off", stop_grace_s=2,
                        python_executable=str(python))
    # A warm relay must carry the very environment of the warm server: not pytest's own.
    monkeypatch.delenv("PYTEST_CURRENT_TEST", raising=False)
    pool = WarmPool(python=str(python), home=home, size=3, preload=WARM_PRELOAD,
                    max_memory_mib=4096, environ=dict(os.environ)) if warm else None
    executor = LocalExecutor(python=str(python), warm=pool, spare_loop=True)
    ctx = LoopContext(
        settings=settings, sessions=None, loop_sessions=None, read_sessions=None,  # type: ignore[arg-type]
        inventory=Inventory(gpus=(), cpu_slots=2), executor=executor, lease=None,  # type: ignore[arg-type]
        api_url="http://127.0.0.1:9", queue_changed=lambda: None, set_waiting=lambda _: None)
    spec = JobSpec.model_validate({
        "entrypoint": "train.py", "package": _package(settings), "nproc_per_node": 2,
        "device": "cpu", "secret_env": {"MY_SECRET": "s"}, "env": {"ROOT_ONLY": str(root_only)},
    })
    ref, ids = None, []
    try:
        if pool is not None:
            _wait_socket(pool, a)
        ref = RunStarter(ctx).start_run(
            1, "job-token-not-a-secret", spec,
            Placement(resources=["cpu:0", "cpu:1"], device="cpu", backend="gloo", gpu_indices=[]),
            run_as=a)
        run = RunDir.for_job(settings.runs_dir, 1)
        ids = _wait_ids(run, 2)

        # --- every process of the job is A's, in A's group only --------------------------
        for rank in ids:
            assert rank["resuid"] == [a.uid] * 3 and rank["resgid"] == [a.gid] * 3, rank
            assert rank["groups"] == [] and rank["secret"], rank
            assert (rank["user"], rank["warm"]) == (a.user, warm), rank
            # Nothing of a warm server stays open in a rank (its lock, its socket's directory).
            assert not any("warm" in target for target in rank["fds"].values()), rank["fds"]
        loop_pid = json.loads(ref)["pid"]
        tree = [psutil.Process(loop_pid), *psutil.Process(loop_pid).children(recursive=True)]
        assert len(tree) >= 2  # the attempt loop, torchrun (warm: its relay) and more below
        for proc in tree + [psutil.Process(r["pid"]) for r in ids]:
            assert tuple(proc.uids()) == (a.uid,) * 3 and tuple(proc.gids()) == (a.gid,) * 3
        if pool is not None:  # A's own warm server served the ranks, as A
            user_pool = pool.users._pools[a.uid]  # type: ignore[union-attr]
            server = psutil.Process(user_pool.status().pid)
            assert tuple(server.uids()) == (a.uid,) * 3
            assert {r["pid"] for r in ids} <= {p.pid for p in server.children()}
        assert LaunchConfig.read(run).run_as == a

        # --- the run directory and all below it are A's; B reads none of it ---------------
        for path in (run.root, run.output_dir, run.spool_dir, run.work_dir, run.logs_dir,
                     run.spec_file, run.launch_file, run.work_dir / "train.py",
                     run.rank_output(1, 0), run.rank_output(1, 1), run.root / "attempt-loop.log"):
            assert path.lstat().st_uid == a.uid, path  # the rank tee's logs too: A wrote them
        for path in (run.root, run.output_dir, run.work_dir):
            assert path.stat().st_mode & 0o777 == 0o700, path
        # A process whose environment (as exec'd: /proc/<pid>/environ) holds the secret: a
        # cold rank itself; a warm rank's relay (a warm process's is its server's, at fork).
        holder = next(p.pid for p in tree if SECRET in "".join(_environ(p).values()))
        paths = {"run": str(run.root), "outputs": str(run.output_dir / "ids-0.json"),
                 "spool": str(run.spool_dir), "package": str(run.work_dir / "train.py"),
                 "log": str(run.rank_output(1, 0)), "environ": f"/proc/{holder}/environ",
                 "rank_environ": f"/proc/{ids[0]['pid']}/environ"}
        by_b = read_as(b, paths, python)
        assert all(str(v).startswith("PermissionError") for v in by_b.values()), by_b
        # ... which A's own processes can (so the refusals above are B's, not the paths').
        by_a = read_as(a, paths, python)
        assert SECRET in by_a["environ"] and "TORCHYARD_OUTPUT_DIR" in by_a["package"], by_a
        assert not any(str(v).startswith(("PermissionError", "FileNotFound")) for v in by_a.values())

        # --- the server (root) reads outputs and logs, never through a planted link --------
        fd, _st = open_artifact(run, "ids-0.json", job_uid(run))
        os.close(fd)
        assert b'"probe"' in (read_bytes(run.spool_file(1), 1 << 20) or b"")
        log = executor.rank_log(run, 1, 0, "combined").path
        assert log is not None and f"runs as uid {a.uid}" in read_tail(log)
        assert read_bytes(root_only, 100) == b"root's own"  # the target itself is readable
        assert (run.output_dir / "leak.txt").is_symlink() and (run.root / "linked").is_symlink()
        assert read_bytes(run.output_dir / "leak.txt", 100) is None
        assert read_bytes(run.root / "linked" / "secret.txt", 100) is None
        with pytest.raises(ArtifactNotFound):
            open_artifact(run, "leak.txt", job_uid(run))

        # --- and it keeps running ---------------------------------------------------------
        assert executor.describe({1: ref})[1].phase is Phase.running
    finally:
        if ref is not None:
            executor.cancel(ref, grace_s=2)
        if pool is not None:
            pool.close()
        if executor.spare is not None:
            executor.spare.close()
    if ref is not None:
        assert all(gone(int(r["pid"])) for r in ids), "a rank outlived the cancel"
        assert gone(json.loads(ref)["pid"])


def test_a_server_that_is_not_root_runs_jobs_as_itself(users: tuple[RunAs, RunAs]) -> None:
    """``resolve_run_as`` of a team's ``unix_user``: None without one or off root; refused (a
    message naming it) for an unknown user, root, or the server's own user."""
    from service.domain.identity.runas import RunAsRefused, resolve_run_as

    a, _b = users
    assert resolve_run_as(None, 0) is None
    assert resolve_run_as(a.user, 0) == a
    assert resolve_run_as(a.user, 1000 if a.uid != 1000 else 1001) is None
    for user, match in (("ty-no-such-user", "not a user on this host"), ("root", "is root")):
        with pytest.raises(RunAsRefused, match=match):
            resolve_run_as(user, 0)
    with pytest.raises(RunAsRefused, match="server's own user"):
        resolve_run_as(a.user, a.uid)


def test_a_user_who_cannot_import_the_attempt_loop_fails_the_launch_saying_why(
    users: tuple[RunAs, RunAs], tmp_path: Path,
) -> None:
    """The local executor checks, as the job's user, that the attempt loop imports with the
    interpreter it would run (``asuser.why_user_cannot_start``) before starting anything: a
    venv that sees none of torchyard's packages, or one below a directory closed to that user,
    fails the launch with the reason (the job's ``reason``), not a job that ends without one."""
    from service.executor.base import ExecutorError, Submission

    a, _b = users
    system = Path(f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}")
    if not system.exists():
        skip_or_fail(f"{system} not found: the check needs an interpreter without torchyard")
    reachable(tmp_path)
    bare, closed = tmp_path / "bare", tmp_path / "closed"
    closed.mkdir(mode=0o700)
    for venv in (bare, closed / "venv"):
        subprocess.run([str(system), "-m", "venv", "--without-pip", str(venv)], check=True,
                       capture_output=True, timeout=120)
    run = RunDir.for_job(tmp_path / "runs", 7)
    run.root.mkdir(parents=True)
    sub = Submission(job_id=7, run=run, env={}, nproc_per_node=1, run_as=a)
    for user_python, says in ((bare / "bin" / "python", "No module named 'service'"),
                              (closed / "venv" / "bin" / "python", "Permission denied")):
        executor = LocalExecutor(user_python=str(user_python))
        with pytest.raises(ExecutorError, match="cannot run job 7 as ") as refused:
            executor.submit(sub)
        assert says in str(refused.value), str(refused.value)
        assert not run.attempt_loop_log.exists()  # nothing was started
    assert f"cannot enter {closed} " in str(refused.value)  # the directory it stopped at
    assert f"cannot enter {closed} " in (a.cannot_enter(closed / "venv" / "bin") or "")
    assert a.cannot_enter(bare / "bin") is None
