"""The warm server and its relay, on real processes: hand-off, isolation, exit codes, signals,
cleanup of everything a warm rank started, and the cold fallback."""

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from service.executor.warmpool import ask, build_server_command
from service.run.torchrun import LaunchRequest, build_command
from service.run.warm import RELAY_PATH
from service.run.warm.server import import_time_mismatch
from tests.conftest import gone
from tests.warmserver import running_warm_server

PROBE = """\
import time; T = time.time()
import json, os, sys
import torch
out = {"first": T, "pid": os.getpid(), "ppid": os.getppid(), "cwd": os.getcwd(),
       "path0": sys.path[0], "path": sys.path, "argv": sys.argv, "threads": torch.get_num_threads(),
       "cuda_initialized": torch.cuda.is_initialized(), "marker": os.environ.get("MARKER"),
       "cvd": os.environ.get("CUDA_VISIBLE_DEVICES"), "sid": os.getsid(0),
       "name": __name__}
with open(os.environ["OUT"], "w") as f:
    json.dump(out, f)
print("to stdout"); print("to stderr", file=sys.stderr)
mode = os.environ.get("MODE", "")
if mode == "exit7":
    sys.exit(7)
if mode == "raise":
    raise ValueError("boom from a warm rank")
if mode == "unclosed":  # a cold interpreter's teardown flushes it; so must a warm one's
    f = open(os.environ["OUT"] + ".unclosed", "w")
    f.write("flushed at exit")
if mode == "interrupt":
    raise KeyboardInterrupt
if mode == "hang":
    import subprocess
    child = subprocess.Popen(["sleep", "300"], start_new_session=True)
    with open(os.environ["OUT"] + ".child", "w") as f:
        f.write(str(child.pid))
    time.sleep(300)
"""

# pytest's, different in every test; torch reads it at import, so a relay carrying it would
# (rightly) start cold.
PER_TEST = ("PYTEST_CURRENT_TEST",)


@pytest.fixture(scope="module")
def warm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    # sklearn.datasets: a preloaded module that changes os.environ (KMP_*) must not make every
    # job look different from the server.
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", *PER_TEST)}
    with running_warm_server(tmp_path_factory.mktemp("warm"), 2, ["torch", "sklearn.datasets"],
                             env) as path:
        yield path


def _relay(socket: str, script: Path, out: Path, tmp_path: Path, **env: str) -> subprocess.Popen:
    full = {**{k: v for k, v in os.environ.items() if k not in PER_TEST}, "OUT": str(out), **env}
    return subprocess.Popen(
        [sys.executable, "-u", str(RELAY_PATH), socket, str(script), "a1", "a2"],
        cwd=tmp_path, env=full, stdout=(tmp_path / "stdout.log").open("wb"),
        stderr=(tmp_path / "stderr.log").open("wb"),
    )


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "scripts" / "probe.py"
    path.parent.mkdir()
    path.write_text(PROBE)
    return path


def test_command_builders_are_pure() -> None:
    req = LaunchRequest(job_id=1, python="py", nproc_per_node=2, master_port=5, run_dir=Path("/r"),
                        logs_dir=Path("/r/l"), program=("-m", "worker", "--spec", "s"),
                        relay=("/x/relay.py", "/s.sock"))
    argv = build_command(req)
    assert argv[:5] == ["py", "/x/relay.py", "/s.sock", "-m", "torch.distributed.run"]
    # The agent only: the rank program carries its own relay (behind the tee, attemptloop).
    assert argv[-5:] == ["--monitor-interval=0.1", "-m", "worker", "--spec", "s"]
    assert argv.count("/x/relay.py") == 1
    cold = build_command(LaunchRequest(**{**req.__dict__, "relay": None}))
    assert cold[:5] == ["py", "-m", "service.run.fastexit", "-m", "torch.distributed.run"]
    assert "/x/relay.py" not in cold
    assert build_server_command("py", "/s", 3, ["torch", "worker.train"], 9) == [
        "py", "-u", "-m", "service.run.warm.server", "--socket", "/s", "--pool", "3",
        "--preload", "torch,worker.train", "--owner", "9"]


def test_import_time_variables_refuse_a_warm_start() -> None:
    ours = {"PATH": "/bin", "PYTHONPATH": "/a"}
    assert import_time_mismatch({"PATH": "/x", "PYTHONPATH": "/b", "OMP_NUM_THREADS": "3"},
                                ours) is None
    assert import_time_mismatch({"PYTHONHASHSEED": "1"}, ours) == "PYTHONHASHSEED"
    assert import_time_mismatch({"LD_PRELOAD": "x.so"}, ours) == "LD_PRELOAD"
    assert import_time_mismatch({"MKL_NUM_THREADS": "2"}, ours) == "MKL_NUM_THREADS"


def test_pool_never_touches_cuda(warm_server: str) -> None:
    status = ask(warm_server, {"op": "status"})
    assert status is not None
    assert status["cuda_initialized"] is False
    assert "torch" in status["preloaded"]
    # No CUDA driver library is mapped in the server: nothing initialised a GPU context.
    maps = Path(f"/proc/{status['pid']}/maps").read_text()
    assert "libcuda.so" not in maps


def test_handoff_applies_the_jobs_env_cwd_path_and_threads(
    warm_server: str, script: Path, tmp_path: Path
) -> None:
    before = ask(warm_server, {"op": "status"})
    assert before is not None
    out = tmp_path / "out.json"
    relay = _relay(warm_server, script, out, tmp_path, MARKER="job-env", OMP_NUM_THREADS="3",
                   CUDA_VISIBLE_DEVICES="")
    assert relay.wait(timeout=60) == 0, (tmp_path / "stderr.log").read_text()
    got = json.loads(out.read_text())
    assert got["marker"] == "job-env" and got["cvd"] == ""
    assert got["threads"] == 3  # torch read OMP_NUM_THREADS at import; the child re-applies it
    assert got["cwd"] == str(tmp_path)
    assert got["path0"] == str(script.parent)  # as `python script.py` puts it
    assert got["argv"] == [str(script), "a1", "a2"] and got["name"] == "__main__"
    assert got["cuda_initialized"] is False
    assert got["pid"] != relay.pid and got["pid"] != before["pid"]
    assert got["sid"] == got["pid"]  # a session of its own
    assert (tmp_path / "stdout.log").read_text() == "to stdout\n"
    assert "to stderr" in (tmp_path / "stderr.log").read_text()
    assert "starting cold" not in (tmp_path / "stderr.log").read_text()
    # Exactly one rank, then gone; the next hand-off is another process.
    assert gone(got["pid"])
    relay2 = _relay(warm_server, script, out, tmp_path)
    assert relay2.wait(timeout=60) == 0
    assert json.loads(out.read_text())["pid"] != got["pid"]
    after = ask(warm_server, {"op": "status"})
    assert after is not None and after["served"] >= before["served"] + 2


def test_a_safe_path_module_job_starts_warm_with_the_path_python_would_give_it(
    warm_server: str, tmp_path: Path
) -> None:
    # A script directory's `-m package.module` job runs with PYTHONSAFEPATH=1 (service.domain.
    # scriptpath): the working directory is not on sys.path, so a module of the same name there
    # is not what runs. Warm, the relay sends that path; the flag itself refuses nothing.
    mods = tmp_path / "scripts"
    (mods / "probemod").mkdir(parents=True)
    (mods / "probemod" / "__main__.py").write_text(PROBE)
    (tmp_path / "probemod").mkdir()  # a decoy in the working directory: must not run
    (tmp_path / "probemod" / "__main__.py").write_text("raise SystemExit('the decoy ran')\n")
    out = tmp_path / "out.json"
    env = {**{k: v for k, v in os.environ.items() if k not in PER_TEST}, "OUT": str(out),
           "PYTHONPATH": str(mods), "PYTHONSAFEPATH": "1"}
    relay = subprocess.Popen(
        [sys.executable, str(RELAY_PATH), warm_server, "-m", "probemod"], cwd=tmp_path, env=env,
        stderr=(tmp_path / "stderr.log").open("wb"), stdout=subprocess.DEVNULL)
    assert relay.wait(timeout=60) == 0, (tmp_path / "stderr.log").read_text()
    assert "starting cold" not in (tmp_path / "stderr.log").read_text()
    got = json.loads(out.read_text())
    assert got["pid"] != relay.pid  # a warm process, not the relay exec'd cold
    assert got["path0"] == str(mods) and str(tmp_path) not in got["path"] and "" not in got["path"]
    assert got["argv"] == [str(mods / "probemod" / "__main__.py")] and got["name"] == "__main__"


@pytest.mark.parametrize(("mode", "code", "words"), [
    ("exit7", 7, None),
    ("raise", 1, "ValueError: boom from a warm rank"),
    ("interrupt", -signal.SIGINT, "KeyboardInterrupt"),
    ("unclosed", 0, None),
])
def test_exit_codes_and_tracebacks_are_relayed(
    warm_server: str, script: Path, tmp_path: Path, mode: str, code: int, words: str | None
) -> None:
    relay = _relay(warm_server, script, tmp_path / "out.json", tmp_path, MODE=mode)
    assert relay.wait(timeout=60) == code
    stderr = (tmp_path / "stderr.log").read_text()
    if words:
        assert words in stderr
        if mode == "raise":  # (an interrupt's traceback also shows the warm server's frames)
            assert "service/warm" not in stderr, "the traceback is the job's, not the server's"
    if mode == "unclosed":
        assert (tmp_path / "out.json.unclosed").read_text() == "flushed at exit"


def test_sigterm_is_forwarded_and_the_signal_is_the_exit(
    warm_server: str, script: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out.json"
    relay = _relay(warm_server, script, out, tmp_path, MODE="hang")
    deadline = time.monotonic() + 60
    while not (tmp_path / "out.json.child").exists():
        assert time.monotonic() < deadline and relay.poll() is None
        time.sleep(0.05)
    rank = json.loads(out.read_text())["pid"]
    relay.send_signal(signal.SIGTERM)
    assert relay.wait(timeout=30) == -signal.SIGTERM
    assert gone(rank)
    # The grandchild it left behind (its own session) is killed too: nothing outlives the rank.
    assert gone(int((tmp_path / "out.json.child").read_text()))


def test_sigkilled_relay_takes_the_warm_rank_and_its_children_with_it(
    warm_server: str, script: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out.json"
    relay = _relay(warm_server, script, out, tmp_path, MODE="hang")
    deadline = time.monotonic() + 60
    while not (tmp_path / "out.json.child").exists():
        assert time.monotonic() < deadline and relay.poll() is None
        time.sleep(0.05)
    rank = json.loads(out.read_text())["pid"]
    grandchild = int((tmp_path / "out.json.child").read_text())
    relay.kill()
    relay.wait()
    assert gone(rank) and gone(grandchild)


def test_killed_warm_rank_exits_its_relay_with_that_signal(
    warm_server: str, script: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out.json"
    relay = _relay(warm_server, script, out, tmp_path, MODE="hang")
    deadline = time.monotonic() + 60
    while not (tmp_path / "out.json.child").exists():
        assert time.monotonic() < deadline and relay.poll() is None
        time.sleep(0.05)
    os.kill(json.loads(out.read_text())["pid"], signal.SIGKILL)
    assert relay.wait(timeout=30) == -signal.SIGKILL


@pytest.mark.parametrize("case", ["no server", "import-time variable", "own torch"])
def test_without_a_usable_server_the_rank_starts_cold_and_says_so(
    warm_server: str, script: Path, tmp_path: Path, case: str
) -> None:
    sock, env = (str(tmp_path / "none.sock"), {}) if case == "no server" else (
        warm_server, {"PYTHONHASHSEED": "5"})
    if case == "own torch":  # a torch of the job's own, first on its path: not the server's
        own = tmp_path / "own"
        (own / "torch").mkdir(parents=True)
        (own / "torch" / "__init__.py").write_text(
            "import sys; sys.path.remove(__path__[0].rsplit('/', 1)[0]); del sys.modules['torch']\n"
            "import torch as _t; sys.modules['torch'] = _t\n")
        sock, env = warm_server, {"PYTHONPATH": str(own)}
    out = tmp_path / "out.json"
    relay = _relay(sock, script, out, tmp_path, MARKER="cold", **env)
    assert relay.wait(timeout=120) == 0
    stderr = (tmp_path / "stderr.log").read_text()
    assert "torchyard: warm start unavailable" in stderr and "starting cold" in stderr
    got = json.loads(out.read_text())
    assert got["marker"] == "cold" and got["argv"] == [str(script), "a1", "a2"]
    assert got["pid"] == relay.pid  # exec'd in place: the relay became the cold rank
