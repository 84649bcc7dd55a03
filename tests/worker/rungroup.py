"""A plain 2-rank torchrun group of the built-in trainer on CPU/gloo, no server (tests/worker/).

The group's torchrun agent and ranks are children of a warm server (``service.run.warm``, the
product's default way to start them) when a test passes the ``warm_ranks`` fixture's socket:
started cold, each of the three processes imports torch (about 9 CPU-seconds a group on the
2-core CI machine); forked warm, about one. The command is the product's own builder's.
"""

import shutil
import subprocess
import sys
from pathlib import Path

from service.run.torchrun import LaunchRequest, build_command
from service.run.warm import RELAY_PATH
from tests.conftest import REPO_ROOT, child_environ, free_port
from torchyard_contract.spec import JobSpec


def environment(run_dir: Path | None = None) -> dict[str, str]:
    """What the group runs with (the warm server the same, so no import-time variable differs)."""
    # child_environ: start-up variables as the session began, none of pytest's own.
    env = {k: v for k, v in child_environ().items() if not k.startswith("TORCHYARD_")} | {
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(REPO_ROOT),
    }
    if run_dir is not None:
        env |= {"TORCHYARD_DEVICE": "cpu", "TORCHYARD_BACKEND": "gloo",
                "TORCHYARD_RUN_DIR": str(run_dir)}
    return env


def run_rank_group(run_dir: Path, spec: JobSpec, warm_socket: str | None = None) -> None:
    """Run ``spec`` as a 2-rank torchrun group on CPU/gloo in ``run_dir`` (no API); its agent
    and ranks forked by the warm server at ``warm_socket`` when given (cold otherwise)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "spec.json").write_text(spec.model_dump_json())
    logs = run_dir.with_name(run_dir.name + ".logs")
    program: tuple[str, ...] = ("-m", "worker", "--spec", str(run_dir / "spec.json"))
    if warm_socket is not None:
        program = (str(RELAY_PATH), warm_socket, *program)
    request = LaunchRequest(
        job_id=0, python=sys.executable, nproc_per_node=2, master_port=free_port(),
        run_dir=run_dir, logs_dir=logs, program=program, cwd=REPO_ROOT,
        relay=(str(RELAY_PATH), warm_socket) if warm_socket is not None else None,
    )
    env = environment(run_dir)
    # torch's gloo/TCPStore very rarely aborts a rank natively ("terminate called without an
    # active exception", then SIGSEGV) on this 2-core box. That is not what this test is about,
    # so on such a crash the run dir is restored to its state before the run and it runs once more.
    before = run_dir.with_name(run_dir.name + ".before")
    shutil.rmtree(before, ignore_errors=True)
    shutil.copytree(run_dir, before)
    for try_number in (1, 2):
        shutil.rmtree(logs, ignore_errors=True)
        logs.mkdir()
        proc = subprocess.run(
            build_command(request), check=False, cwd=REPO_ROOT, env=env, capture_output=True,
            text=True, timeout=180,
        )
        output = proc.stderr + proc.stdout
        native_crash = "(SIGSEGV)" in output or "(SIGABRT)" in output
        if proc.returncode == 0 or not native_crash or try_number == 2:
            break
        shutil.rmtree(run_dir)
        shutil.copytree(before, run_dir)
    assert proc.returncode == 0, output[-4000:]
    if warm_socket is not None:  # the agent's and the ranks' relays were served, none went cold
        logged = output + "".join(p.read_text(errors="replace") for p in logs.rglob("*.log"))
        assert "warm start unavailable" not in logged, logged[-4000:]
