"""On Slurm, a job's variables reach only the job: never the ``sbatch`` the server runs, never the
choice of that program, never sbatch's options; and a Slurm command that hangs holds neither the
supervisor nor the other jobs, and leaves no Slurm job running untracked (issue 23, finding 1).

Against the real Slurm 22.05 of ``tests/slurmcluster.py`` (the ``slurm`` fixtures of
``tests/conftest.py``).
"""

import json
import os
import shutil
import stat
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from service.executor import make_slurm_executor
from service.executor.base import Submission
from service.settings import Settings
from tests.conftest import LiveServer, module_slurm_server, slurm_state
from tests.slurmcluster import SlurmCluster
from torchyard_contract.rundir import RunDir
from torchyard_contract.spec import JobSpec

API_TOKEN = "slurm-security-api-token-0123456789"
TOKEN = "job-token-that-must-stay-in-the-job-0123456789"
QUICK_JOB = {"dataset": "synthetic", "epochs": 1, "device": "cpu", "synthetic_samples": 64}


def _executable(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def _slurm_jobs_of(cluster: SlurmCluster, run_dir: Path) -> list[dict[str, str]]:
    """Every job Slurm lists whose working directory is ``run_dir``, with its name and limit."""
    out = cluster.run("squeue", "-h", "-t", "all", "-o", "%i|%j|%T|%l|%K|%Z", check=False).stdout
    rows = []
    for line in out.splitlines():
        job_id, name, state, limit, array, work_dir = line.split("|", 5)
        if work_dir == str(run_dir):
            rows.append({"id": job_id, "name": name, "state": state, "limit": limit,
                         "array": array})
    return rows


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


# --- reserved names --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def script_server(
    slurm: SlurmCluster, tmp_path_factory: pytest.TempPathFactory, _migrated_sqlite: Path
) -> Iterator[LiveServer]:
    """One server for the cases below: each is refused at the API, so none leaves a job."""
    root = tmp_path_factory.mktemp("slurm-reserved")
    scripts = root / "scripts"
    scripts.mkdir()
    (scripts / "noop.py").write_text("print('hello')\n")
    with module_slurm_server(slurm, root / "home", _migrated_sqlite,
                             TORCHYARD_SCRIPT_DIRS=str(scripts),
                             TORCHYARD_API_TOKENS=API_TOKEN) as server:
        yield server


@pytest.mark.parametrize(
    ("field", "names"),
    [
        ("env", ["PATH"]),
        ("env", ["SBATCH_TIMELIMIT", "SBATCH_JOB_NAME"]),
        ("env", ["PATH", "SBATCH_WAIT", "SLURM_CONF", "SRUN_CPUS_PER_TASK", "SALLOC_PARTITION"]),
        ("secret_env", ["SBATCH_ACCOUNT"]),
    ],
)
def test_path_and_slurms_variables_are_reserved_in_a_spec(
    script_server: LiveServer, field: str, names: list[str]
) -> None:
    value = "hf" if field == "secret_env" else "x"
    body = {"entrypoint": "noop.py", field: dict.fromkeys(names, value)}
    with script_server.client() as c:
        c.headers["Authorization"] = f"Bearer {API_TOKEN}"
        r = c.post("/jobs", json=body)
        assert r.status_code == 422, r.text
        (detail,) = r.json()["details"]
        assert detail["field"] == field, detail
        for name in names:
            assert name in detail["message"], detail
        for reserved in ("PATH", "SBATCH_*", "SLURM_*", "SRUN_*", "SALLOC_*", "TORCHYARD_*"):
            assert reserved in detail["message"], detail  # the reserved set, in words
        assert c.get("/jobs").json()["items"] == []


# --- what sbatch runs with -------------------------------------------------------------------


def test_a_jobs_variables_never_reach_sbatch_and_a_planted_sbatch_never_runs(
    slurm: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The executor itself, given variables the spec now refuses (a spec stored before they
    were reserved): sbatch is the server's, by its absolute path, and sees none of them."""
    real_sbatch = shutil.which("sbatch")
    assert real_sbatch is not None
    # The server's own PATH starts with a recorder that notes sbatch's argv and environment.
    recorder_dir = tmp_path / "server-bin"
    recorder_dir.mkdir()
    record = tmp_path / "sbatch-saw.json"
    _executable(recorder_dir / "sbatch", (
        "#!/bin/sh\n"
        f"{sys.executable} -c 'import json, os, sys; "
        f"json.dump({{\"argv\": sys.argv[1:], \"env\": dict(os.environ)}}, "
        f"open(\"{record}\", \"w\"))' \"$@\"\n"
        f'exec {real_sbatch} "$@"\n'
    ))
    monkeypatch.setenv("PATH", f"{recorder_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_CONF", slurm.env["SLURM_CONF"])
    home = tmp_path / "home"
    settings = Settings(home=home, executor="slurm", gpus="none")
    executor = make_slurm_executor(settings)

    # A directory the job controls (its run directory), with an sbatch of its own in it.
    run = RunDir.for_job(settings.runs_dir, 7)
    run.prepare()
    run.spec_file.write_text(JobSpec.model_validate(QUICK_JOB).model_dump_json())
    planted_marker = tmp_path / "planted-sbatch-ran"
    _executable(run.root / "sbatch", f"#!/bin/sh\ntouch {planted_marker}\necho 999\n")
    hostile = {
        "PATH": f"{run.root}:/usr/bin:/bin",
        "SBATCH_JOB_NAME": "evil", "SBATCH_TIMELIMIT": "9-00:00:00", "SBATCH_ARRAY_INX": "0-2",
        "SBATCH_WAIT": "1", "SBATCH_PARTITION": "nosuch",
    }
    env = {**hostile, "TORCHYARD_JOB_TOKEN": TOKEN, "MULTILINE": "a=b\nc d"}
    started = time.monotonic()
    job_id = executor.submit(Submission(job_id=7, run=run, env=env, nproc_per_node=1))
    try:
        assert time.monotonic() - started < 10  # SBATCH_WAIT did not make sbatch wait
        assert not planted_marker.exists()
        saw = json.loads(record.read_text())
        # sbatch's own environment: the server's basics; nothing of the job's.
        assert saw["env"]["PATH"] == os.environ["PATH"]
        assert not {name for name in saw["env"] if name.startswith("SBATCH_")}
        assert TOKEN not in json.dumps(saw), "the job token reached sbatch's argv or environment"
        assert "MULTILINE" not in saw["env"]
        (export,) = [a for a in saw["argv"] if a.startswith("--export-file=")]
        assert export.removeprefix("--export-file=").isdigit()  # a descriptor, not a file
        # Slurm took the validated batch script's options, none of the job's SBATCH_*.
        (row,) = _slurm_jobs_of(slurm, run.root)
        assert row["id"] == job_id and row["name"] == "ty-7", row
        assert row["limit"] != "9-00:00:00" and row["array"] in ("N/A", ""), row
        # The token is in no file of the run directory (it travelled in an anonymous memfd).
        for path in run.root.rglob("*"):
            if path.is_file():
                assert TOKEN.encode() not in path.read_bytes(), path
        # The program is the one found on the server's PATH at start, by its absolute path.
        assert executor.cli.programs["sbatch"] == str(recorder_dir / "sbatch")
    finally:
        executor.cancel(job_id, 0)


# --- a Slurm command that hangs ----------------------------------------------------------------


def test_a_hung_sbatch_holds_no_other_job_and_leaves_nothing_untracked(
    slurm: SlurmCluster, slurm_server: Callable[..., LiveServer], tmp_path: Path
) -> None:
    """The server's own sbatch hangs for two jobs: for job 1 after submitting it (as
    ``SBATCH_WAIT`` did), for job 2 before. Job 3 is submitted and runs meanwhile; at the
    timeout job 1 is found by its name and adopted, job 2 fails saying why, and both hung
    sbatch processes are gone."""
    real_sbatch = shutil.which("sbatch")
    assert real_sbatch is not None
    wrapper_dir = tmp_path / "server-bin"
    wrapper_dir.mkdir()
    _executable(wrapper_dir / "sbatch", (
        "#!/bin/sh\n"
        'for arg in "$@"; do script="$arg"; done\n'
        'case "$script" in\n'
        f'  */runs/1/job.sbatch) echo $$ > {wrapper_dir}/hung-1.pid; {real_sbatch} "$@"; '
        "exec sleep 300 ;;\n"
        f"  */runs/2/job.sbatch) echo $$ > {wrapper_dir}/hung-2.pid; exec sleep 300 ;;\n"
        f'  *) exec {real_sbatch} "$@" ;;\n'
        "esac\n"
    ))
    timeout_s = 20
    server = slurm_server(PATH=f"{wrapper_dir}:{os.environ['PATH']}",
                          TORCHYARD_SLURM_COMMAND_TIMEOUT_S=str(timeout_s))
    with server.client() as c:
        ids = [c.post("/jobs", json=QUICK_JOB).json()["id"] for _ in range(3)]
    assert ids == [1, 2, 3]
    hung = [wrapper_dir / "hung-1.pid", wrapper_dir / "hung-2.pid"]
    deadline = time.monotonic() + timeout_s - 3  # before job 1's sbatch is killed
    while not (hung[0].exists() and hung[0].read_text().strip()):
        assert time.monotonic() < deadline, "the server never ran its sbatch for job 1"
        time.sleep(0.05)

    # Job 3 goes through while both sbatch calls still hang: the loop never waited for them.
    with server.client() as c:
        while (job3 := c.get("/jobs/3").json())["state"] == "queued":
            assert time.monotonic() < deadline, f"job 3 waits behind job 1's hung sbatch: {job3}"
            time.sleep(0.1)
        assert all(p.exists() for p in hung), "job 2's sbatch never started"
        pids = [int(p.read_text()) for p in hung]
        assert all(_alive(pid) for pid in pids), "the hung sbatch calls ended before job 3 ran"
        assert [c.get(f"/jobs/{i}").json()["state"] for i in (1, 2)] == ["queued", "queued"]
    assert job3["state"] in ("starting", "running", "succeeded"), job3

    # At the timeout: job 1's sbatch had submitted it; it is found by name and adopted.
    job1 = server.wait_for(1, {"succeeded"}, timeout_s=timeout_s + 90)
    assert job1["exit_code"] == 0
    assert "adopted" in server.log.read_text()
    # Job 2's never reached Slurm: it fails saying so, and no Slurm job of it exists.
    job2 = server.wait_for(2, {"failed"}, timeout_s=30, allowed={"queued"})
    assert "did not answer within" in job2["reason"], job2["reason"]
    assert "not submitted" in job2["reason"], job2["reason"]
    assert slurm_state(slurm, server, 2) is None
    server.wait_for(3, {"succeeded"}, timeout_s=90)
    # Exactly one Slurm job per submitted torchyard job, and no hung process left.
    for job_id in (1, 3):
        assert len(_slurm_jobs_of(slurm, (server.home / "runs" / str(job_id)).resolve())) <= 1
    assert not any(_alive(pid) for pid in pids)
