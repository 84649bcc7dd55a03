"""The end path: a process that ran a job ends as ``python`` ends a program, without tearing
down what was preloaded (``service.run.fastexit``: the cold torchrun agent; the warm child), and
a warm job loses nothing on the way to ``succeeded``. Real interpreters, a real warm server, a
real live server with torchrun."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from service.executor.warmpool import ask, build_server_command, socket_path
from service.run.warm import RELAY_PATH
from tests.conftest import REPO_ROOT, LiveServer, add_script, every_record
from tests.warm.warmjobs import wait_warm

# Everything a program can see of its interpreter's end, per MODE.
PROGRAM = textwrap.dedent("""
    import atexit, os, sys, threading, time

    class Torn:
        def __del__(self):
            sys.stderr.write("module teardown ran\\n")

    KEEP = Torn()  # a module global: only an interpreter's teardown collects it
    mode = os.environ["MODE"]
    atexit.register(lambda: print("atexit ran", flush=True))
    def late():
        time.sleep(0.3)
        print("non-daemon thread finished", flush=True)
    threading.Thread(target=late).start()
    unclosed = open(os.environ["OUT"], "w")
    unclosed.write("buffered, never closed")
    sys.stdout.write("last line, no newline")
    if mode == "exit3":
        sys.exit(3)
    if mode == "message":
        sys.exit("a message instead of a code")
    if mode == "raise":
        raise ValueError("boom")
    if mode == "interrupt":
        raise KeyboardInterrupt
""")
MODES = [("ok", 0), ("exit3", 3), ("message", 1), ("raise", 1), ("interrupt", -signal.SIGINT)]


def _outcome(argv: list[str], tmp_path: Path, mode: str, **env: str) -> tuple[int, str, str, str]:
    out = tmp_path / f"{mode}-{len(list(tmp_path.iterdir()))}.txt"
    done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "MODE": mode, "OUT": str(out),
                               "PYTHONPATH": str(REPO_ROOT), **env})
    return done.returncode, done.stdout, done.stderr, out.read_text()


@pytest.fixture
def program(tmp_path: Path) -> str:
    (tmp_path / "endprog.py").write_text(PROGRAM)
    return "endprog"


@pytest.mark.parametrize(("mode", "code"), MODES, ids=[m for m, _ in MODES])
def test_fastexit_ends_a_program_as_python_does_but_the_teardown(
    program: str, tmp_path: Path, mode: str, code: int
) -> None:
    cold = _outcome([sys.executable, "-m", program], tmp_path, mode)
    fast = _outcome([sys.executable, "-m", "service.run.fastexit", "-m", program], tmp_path, mode)
    assert cold[0] == fast[0] == code
    assert fast[1] == cold[1]  # stdout: the last line, the thread's, atexit's, in that order
    assert "atexit ran" in fast[1] and "non-daemon thread finished" in fast[1]
    assert fast[1].startswith("last line, no newline")
    assert fast[3] == cold[3] == "buffered, never closed"
    assert "module teardown ran" in cold[2] and "module teardown ran" not in fast[2]
    for words in {"message": ["a message instead of a code"], "raise": ["ValueError: boom"],
                  "interrupt": ["KeyboardInterrupt"]}.get(mode, []):
        assert words in cold[2] and words in fast[2]
    if mode == "raise":  # the traceback is the program's, not fastexit's
        assert "service/run/fastexit.py" not in fast[2]


def test_fastexit_imports_a_programs_package_once_and_runs_it_with_the_collector_on(
    tmp_path: Path,
) -> None:
    package = tmp_path / "endpkg"
    package.mkdir()
    (package / "__init__.py").write_text("print('package imported')\n")
    (package / "main.py").write_text("import gc\nprint('collector', gc.isenabled())\n")
    fast = [sys.executable, "-m", "service.run.fastexit", "-m"]
    ran = subprocess.run([*fast, "endpkg.main"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=60, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert (ran.returncode, ran.stdout) == (0, "package imported\ncollector True\n"), ran.stderr
    for module in ("nopkg.main", "endpkg.nomodule"):  # worded as python -m words it
        cold = subprocess.run([sys.executable, "-m", module], cwd=tmp_path, capture_output=True,
                              text=True, timeout=60)
        missing = subprocess.run([*fast, module], cwd=tmp_path, capture_output=True, text=True,
                                 timeout=60, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
        assert cold.returncode == missing.returncode == 1
        assert cold.stderr.splitlines()[-1].split(": ", 1)[1] in missing.stderr


@pytest.fixture(scope="module")
def warm_socket(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real warm server preloading the standard library's json (torch's teardown is what
    costs; whether a teardown runs at all does not depend on what was preloaded)."""
    home = tmp_path_factory.mktemp("warm")
    path = socket_path(home)
    proc = subprocess.Popen(build_server_command(sys.executable, path, 1, ["json"], os.getpid()),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True, cwd=REPO_ROOT)
    deadline = time.monotonic() + 60
    while ask(path, {"op": "status"}) is None:
        assert proc.poll() is None and time.monotonic() < deadline, "no warm server"
        time.sleep(0.1)
    yield path
    ask(path, {"op": "drain"})
    proc.wait(timeout=30)


@pytest.mark.parametrize(("mode", "code"), MODES, ids=[m for m, _ in MODES])
def test_a_warm_process_ends_as_python_does_without_tearing_down(
    program: str, tmp_path: Path, warm_socket: str, mode: str, code: int
) -> None:
    served = ask(warm_socket, {"op": "status"})["served"]  # type: ignore[index]
    cold = _outcome([sys.executable, "-m", program], tmp_path, mode)
    warm = _outcome([sys.executable, str(RELAY_PATH), warm_socket, "-m", program], tmp_path, mode)
    assert ask(warm_socket, {"op": "status"})["served"] == served + 1, warm[2]  # type: ignore[index]
    assert warm[0] == cold[0] == code
    assert warm[1] == cold[1] and warm[3] == cold[3] == "buffered, never closed"
    assert "module teardown ran" in cold[2] and "module teardown ran" not in warm[2]
    for words in {"message": ["a message instead of a code"], "raise": ["ValueError: boom"],
                  "interrupt": ["KeyboardInterrupt"]}.get(mode, []):
        assert words in warm[2]


def test_the_cold_agent_runs_under_fastexit() -> None:
    from service.run.torchrun import LaunchRequest, build_command

    req = LaunchRequest(job_id=1, python="py", nproc_per_node=1, master_port=5,
                        run_dir=Path("/r"), logs_dir=Path("/r/l"), program=("s.py",))
    assert build_command(req)[:5] == ["py", "-m", "service.run.fastexit", "-m",
                                      "torch.distributed.run"]


JOB = textwrap.dedent("""
    import os, sys, time
    import worker
    rank = int(os.environ["RANK"])
    for step in range(40):
        worker.report(epoch=0, step=step, loss=float(step))
    if rank == 1 and os.environ.get("FAIL") == "1":
        sys.stderr.write("rank 1 fails now")
        sys.exit(3)
    sys.stdout.write(f"rank {rank} last stdout line")
    sys.stderr.write(f"rank {rank} last stderr line")
    open(f"last-{rank}.txt", "w").write(repr(time.time()))
""")


def _wait(c: httpx.Client, job_id: int) -> dict:
    """``/wait`` until the job is terminal (each call within the client's timeout)."""
    deadline = time.monotonic() + 180
    while (job := c.get(f"/jobs/{job_id}/wait", params={"timeout": 5}).json())["state"] not in \
            ("succeeded", "failed", "cancelled"):
        assert time.monotonic() < deadline, job
    return job


@pytest.mark.slow
def test_a_warm_job_ends_with_nothing_lost(shared_script_server: LiveServer) -> None:
    """Warm ranks (the agent and both ranks warm processes): every record a rank sent before it
    exited is stored when the job turns terminal, the last unterminated lines of both streams
    are in the rank's log, and a rank's exit code reads as it does cold."""
    server = shared_script_server
    add_script(server, "ending.py", JOB)
    wait_warm(server)
    served = ask(server.warm_socket, {"op": "status"})["served"]  # type: ignore[index]
    with server.client() as c:
        job_id = c.post("/jobs", json={"entrypoint": "ending.py", "nproc_per_node": 2}).json()["id"]
        job = _wait(c, job_id)
        assert job["state"] == "succeeded", job
        # At the moment /wait answered: every record of both ranks is stored.
        records = every_record(server, job_id)
        assert sorted((r["rank"], r["step"]) for r in records if r["name"] == "loss") == \
            [(r, s) for r in (0, 1) for s in range(40)]
        # The server's own count (/resources shows the pool's last poll, up to CHECK_S old).
        now = ask(server.warm_socket, {"op": "status"})["served"]  # type: ignore[index]
        assert now >= served + 3, "not all warm"
        run = server.home / "runs" / str(job_id)
        for rank in (0, 1):
            log = run.joinpath("logs", "attempt-1", f"rank-{rank}.log").read_text()
            assert f"rank {rank} last stdout line" in log and f"rank {rank} last stderr line" in log
            assert "starting cold" not in log
        attempt = json.loads((run / "attempts" / "1.json").read_text())
        assert attempt["exit_code"] == 0 and attempt["rank_exit_codes"] == {"0": 0, "1": 0}

        failing = c.post("/jobs", json={"entrypoint": "ending.py", "nproc_per_node": 2,
                                        "env": {"FAIL": "1"}}).json()
        assert "id" in failing, failing
        job = _wait(c, failing["id"])
        assert job["state"] == "failed", job
        attempt = json.loads((server.home / "runs" / str(failing["id"]) / "attempts" /
                              "1.json").read_text())
        assert attempt["rank_exit_codes"].get("1") == 3, attempt
        log = (server.home / "runs" / str(failing["id"]) / "logs" / "attempt-1" /
               "rank-1.log").read_text()
        assert "rank 1 fails now" in log


def test_warm_ranks_are_on_by_default_and_the_pool_is_sized_from_the_slots(tmp_path: Path) -> None:
    from service.app import warm_pool_size
    from service.settings import Settings

    assert Settings.model_fields["warm_ranks"].default is True
    assert "torchvision" not in Settings.model_fields["warm_preload"].default
    base = {"home": tmp_path, "gpus": "none"}
    assert warm_pool_size(Settings(**base, cpu_slots=2)) == 3  # a 2-rank job and its agent
    assert warm_pool_size(Settings(**base, cpu_slots=64)) == 8
    assert warm_pool_size(Settings(**base, cpu_slots=64, warm_pool_size=5)) == 5
