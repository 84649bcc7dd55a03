"""The spare attempt loop: a job's attempt loop started ahead of the job takes the job's environment,
directory and log, runs it as an ordinary attempt loop would, and a server going away lets it go."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from service.executor.base import Phase, Submission
from service.executor.local import LocalExecutor
from service.executor.spareloop import SpareLoop
from torchyard_contract.launch import LaunchConfig
from torchyard_contract.rundir import RunDir

SCRIPT = "import os\nopen('seen.txt', 'w').write(os.environ.get('MARKER', '') + ' ' + os.getcwd())\n"


def _run_dir(tmp_path: Path, job_id: int) -> RunDir:
    script = tmp_path / "first.py"
    script.write_text(SCRIPT)
    run = RunDir(tmp_path / "runs" / str(job_id))
    run.prepare()
    LaunchConfig(job_id=job_id, python=sys.executable, nproc_per_node=1, max_restarts=0,
               max_runtime_s=60, heartbeat_timeout_s=None, stop_grace_s=2,
               program=[str(script)]).write(run)
    return run


def _wait_spare(executor: LocalExecutor) -> None:
    deadline = time.monotonic() + 30
    while executor.spare is None or executor.spare._proc is None:
        assert time.monotonic() < deadline, "no spare attempt loop was started"
        time.sleep(0.05)


def test_second_job_runs_in_the_spare_attempt_loop_with_its_own_env_and_log(tmp_path: Path) -> None:
    executor = LocalExecutor(spare_loop=True)
    try:
        refs = {}
        for job_id in (1, 2):
            run = _run_dir(tmp_path, job_id)
            if job_id == 2:
                _wait_spare(executor)
                spare_pid = executor.spare._proc.pid  # type: ignore[union-attr]
            refs[job_id] = executor.submit(Submission(
                job_id=job_id, run=run, env={"MARKER": f"job-{job_id}"}, nproc_per_node=1))
        assert json.loads(refs[2])["pid"] == spare_pid
        deadline = time.monotonic() + 120
        while any(s.phase is not Phase.ended for s in executor.describe(refs).values()):
            assert time.monotonic() < deadline, "jobs did not end"
            time.sleep(0.2)
        for job_id in (1, 2):
            run = RunDir(tmp_path / "runs" / str(job_id))
            assert json.loads(run.exit_file.read_text())["state"] == "succeeded"
            assert (run.root / "seen.txt").read_text() == f"job-{job_id} {run.root}"
            assert (run.root / "attempt-loop.log").exists()
    finally:
        if executor.spare is not None:
            executor.spare.close()


def test_a_spare_whose_server_went_away_exits(tmp_path: Path) -> None:
    spare = SpareLoop(sys.executable)
    spare.refill()
    deadline = time.monotonic() + 30
    while spare._proc is None:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    proc = spare._proc
    spare.close()  # closes its stdin, as the server's exit would
    assert proc.wait(timeout=30) == 0
    assert spare.take(RunDir(tmp_path), dict(os.environ)) is None


def test_an_attempt_loop_starts_without_the_retry_rules_or_built_attempt_models() -> None:
    # Every job's attempt loop (a spare one ahead of every job) pays its imports: the retry rules and
    # the attempt-file models' schemas were ~0.1 CPU s of its ~0.29 (docs/benchmarks.md). They
    # are built when first used: at a failure, on reading an earlier attempt.
    probe = (
        "import json, sys\n"
        "import service.run.attemptloop\n"
        "from torchyard_contract import runfiles\n"
        "print(json.dumps({'modules': sorted(m for m in sys.modules if 'retry' in m),\n"
        "                  'built': runfiles.AttemptFile.__pydantic_complete__}))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    seen = json.loads(out)
    assert seen == {"modules": [], "built": False}, seen


def test_a_python_process_of_the_environment_imports_no_install_hook() -> None:
    # An editable install's import finder doubled every interpreter start (docs/dependencies.md):
    # every attempt loop, tee, relay and rank of every job paid it. A plain path line costs nothing.
    probe = "import sys; print(sorted(m for m in sys.modules if m.startswith('__editable__')))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, timeout=60, cwd="/").stdout
    assert json.loads(out.replace("'", '"')) == [], out
