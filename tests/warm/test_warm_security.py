"""Warm ranks against another local user, several workers and import-time variables
(docs/warm-ranks.md, docs/security.md): a socket directory another uid made first is never
used (jobs start cold and say why); a process of another uid is never sent anything, by the pool
or by a relay (``SO_PEERCRED``); ``serve --workers 2`` runs one warm server; a job that sets a
variable torch reads at import (``TORCH_LOGS``) starts cold, one that does not starts warm."""

import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from service.executor.warmpool import ask, lock_holder, socket_path
from service.run.warm import RELAY_PATH, relay
from service.run.warm.server import environ_reads, import_time_mismatch
from tests.conftest import LiveServer, _start_server, _stop_server
from tests.warm.warmjobs import WARM_ENV, WARM_READY_TIMEOUT_S, rank_logs

NOBODY = 65534
API_TOKEN = "warm-security-token-0123456789abcdef"
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another uid")

# A stand-in for another local user's process posing as the warm server: it answers every
# connection at once with a status as the real server would, then records what the client sent
# (bytes and file descriptors) until the client closes. Runs as uid 65534 on a listening socket
# the test bound (argv[1]: its fd; argv[2]: how many connections to take).
FAKE_SERVER = """\
import json, os, socket, struct, sys
sock = socket.socket(fileno=int(sys.argv[1]))
sock.listen(8)  # as uid 65534: SO_PEERCRED names the process that listens
print("listening", flush=True)
sock.settimeout(60)
status = json.dumps({"pid": os.getpid(), "idle": 4, "active": 0, "served": 0, "refused": 0,
                     "cuda_initialized": False, "idle_pids": []}).encode()
for _ in range(int(sys.argv[2])):
    conn, _ = sock.accept()
    conn.settimeout(10)
    try:
        conn.sendall(struct.pack(">I", len(status)) + status)
    except OSError:
        pass
    got, fds = 0, 0
    try:
        while True:
            data, anc, _flags, _addr = conn.recvmsg(1 << 16, socket.CMSG_SPACE(16 * 4))
            fds += sum(len(item[2]) // 4 for item in anc)
            if not data:
                break
            got += len(data)
    except OSError:
        pass
    print(json.dumps({"uid": os.getuid(), "bytes": got, "fds": fds}), flush=True)
"""


def _as_nobody() -> None:
    os.setgid(NOBODY)
    os.setuid(NOBODY)


def test_import_time_variables_of_torch_refuse_a_warm_start() -> None:
    ours = {"PATH": "/bin", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}
    for name in ("TORCH_LOGS", "TORCH_SHOW_CPP_STACKTRACES", "TORCH_CPP_LOG_LEVEL",
                 "PYTORCH_CUDA_ALLOC_CONF", "TORCHDYNAMO_VERBOSE", "TORCHINDUCTOR_CACHE_DIR",
                 "OPENBLAS_NUM_THREADS", "MALLOC_ARENA_MAX", "GLIBC_TUNABLES"):
        assert import_time_mismatch({**ours, name: "1"}, ours) == name, name
    # What the preload read (recorded) counts too; other variables do not.
    assert import_time_mismatch({**ours, "SKLEARN_WORKING_MEMORY": "9"}, ours,
                                {"SKLEARN_WORKING_MEMORY"}) == "SKLEARN_WORKING_MEMORY"
    assert import_time_mismatch({**ours, "MY_SETTING": "1"}, ours, {"SKLEARN_X"}) is None
    # torchyard's, torchrun's and the NCCL ones are read after the hand-off: they stay warm.
    job = {**ours, "TORCHYARD_JOB_ID": "7", "TORCHELASTIC_RUN_ID": "x", "RANK": "1",
           "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3", "TORCH_NCCL_BLOCKING_WAIT": "1"}
    assert import_time_mismatch(job, ours, {"TORCHELASTIC_RUN_ID"}) is None


def test_reads_of_the_environment_are_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("READ_AT_IMPORT_SET", "1")
    monkeypatch.delenv("READ_AT_IMPORT_UNSET", raising=False)
    original = type(os.environ).__getitem__
    with environ_reads() as read:
        assert os.environ["READ_AT_IMPORT_SET"] == "1"
        assert os.getenv("READ_AT_IMPORT_UNSET") is None
        assert "READ_AT_IMPORT_IN" not in os.environ
    assert read == {"READ_AT_IMPORT_SET", "READ_AT_IMPORT_UNSET", "READ_AT_IMPORT_IN"}
    assert type(os.environ).__getitem__ is original


def test_only_a_private_directory_of_ours_is_trusted(tmp_path: Path) -> None:
    good = tmp_path / "good"
    relay.make_private_dir(str(good))
    assert good.stat().st_mode & 0o777 == 0o700
    os.close(relay.private_dir(str(good)))
    loose = tmp_path / "loose"
    loose.mkdir(mode=0o755)
    loose.chmod(0o755)
    with pytest.raises(relay.Untrusted, match="mode 0755"):
        relay.make_private_dir(str(loose))  # never repaired: someone may have used it
    link = tmp_path / "link"
    link.symlink_to(good)
    with pytest.raises(relay.Untrusted, match="symlink"):
        relay.private_dir(str(link))
    if os.geteuid() == 0:
        os.chown(good, NOBODY, NOBODY)
        with pytest.raises(relay.Untrusted, match=f"owned by uid {NOBODY}"):
            relay.private_dir(str(good))


@as_root
def test_a_server_of_another_uid_is_sent_nothing(tmp_path: Path) -> None:
    # The socket sits in a private directory of ours (so only the peer check can catch it);
    # the process listening on it is another user's.
    directory = tmp_path / "warm"
    directory.mkdir(mode=0o700)
    path = str(directory / "server.sock")
    bound = socket.socket(socket.AF_UNIX)
    bound.bind(path)
    fake = subprocess.Popen(
        ["/usr/bin/python3", "-c", FAKE_SERVER, str(bound.fileno()), "2"],
        pass_fds=[bound.fileno()], preexec_fn=_as_nobody, cwd="/",
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    bound.close()
    try:
        assert fake.stdout is not None and fake.stdout.readline() == "listening\n"
        # The pool asking for the status: no answer taken from it.
        assert ask(path, {"op": "status", "owner": os.getpid()}) is None
        # A rank's relay: its environment (secrets, job token) and stdio never reach it; the
        # rank starts cold, saying why.
        env = {**os.environ, "SECRET_VALUE": "s3cret", "TORCHYARD_JOB_TOKEN": "job-token"}
        rank = subprocess.run(
            [sys.executable, "-u", str(RELAY_PATH), path, "-c", "print('the cold rank ran')"],
            env=env, capture_output=True, text=True, timeout=60,
        )
        assert rank.returncode == 0, rank.stderr
        assert "the cold rank ran" in rank.stdout
        assert "warm start unavailable (refusing the warm server" in rank.stderr, rank.stderr
        assert f"served by uid {NOBODY}" in rank.stderr, rank.stderr
        out, _ = fake.communicate(timeout=60)
    finally:
        if fake.poll() is None:
            fake.kill()
            fake.wait()
    seen = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert len(seen) == 2, out
    assert all(s["uid"] == NOBODY for s in seen)
    assert seen == [{"uid": NOBODY, "bytes": 0, "fds": 0}] * 2, f"it was sent something: {seen}"


@as_root
@pytest.mark.slow
def test_squatted_socket_directory_is_refused_and_jobs_start_cold_saying_why(
    live_server_factory: Callable[..., LiveServer], tmp_path: Path,
) -> None:
    home = tmp_path / "home0"  # the factory's first home
    squatted = Path(socket_path(home)).parent
    squatted.mkdir(parents=True, mode=0o700)
    os.chown(squatted, NOBODY, NOBODY)  # another user made it first
    server = live_server_factory(_home=home, **{**WARM_ENV, "TORCHYARD_WARM_POOL_SIZE": "1"})
    deadline = time.monotonic() + 60
    with server.client() as c:
        while (warm := c.get("/resources").json()["warm"])["state"] == "starting":
            assert time.monotonic() < deadline, warm
            time.sleep(0.2)
        assert warm["state"] == "broken", warm
        job_id = c.post("/jobs", json={"dataset": "synthetic", "epochs": 1,
                                       "nproc_per_node": 1}).json()["id"]
    server.wait_for(job_id, {"succeeded"})
    logs = rank_logs(server, job_id)
    assert "warm start unavailable (the warm socket's directory is unsafe" in logs, logs
    assert f"{squatted} is owned by uid {NOBODY}" in logs, logs
    assert "starting cold" in logs
    # Nothing of ours went into it, and it was left as it was.
    assert list(squatted.iterdir()) == []
    assert squatted.stat().st_uid == NOBODY
    assert "warm ranks are off until it is fixed" in server.log.read_text()


# --- one server with two workers and warm ranks (shared: its warm server imports torch) -------

PROBE = """\
import json, logging, os
import torch
print("probe:", json.dumps({
    "dynamo_level": logging.getLogger("torch._dynamo").level,
    "torch_logs": os.environ.get("TORCH_LOGS"),
    "my_setting": os.environ.get("MY_SETTING"),
}), flush=True)
"""


def _fresh_get(server: LiveServer, path: str) -> httpx.Response:
    """On a new connection: with ``--workers`` the kernel picks the worker per connection."""
    return httpx.get(server.url + path, headers={"Authorization": f"Bearer {API_TOKEN}"},
                     timeout=10)


@pytest.fixture(scope="module")
def two_workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    # A home long enough that its socket path is over sun_path's 108 bytes: no fallback to a
    # directory elsewhere, the socket is in the home all the same.
    base = tmp_path_factory.mktemp("workers")
    home = base / ("a-home-with-a-long-name-" + "h" * 80)
    scripts = base / "scripts"
    scripts.mkdir()
    (scripts / "probe.py").write_text(PROBE)
    server = _start_server(home, {
        **WARM_ENV, "TORCHYARD_API_TOKENS": API_TOKEN, "TORCHYARD_SCRIPT_DIRS": str(scripts),
    }, args=("--workers", "2"))
    try:
        # Both workers' pools see the one warm server ready.
        deadline, ready = time.monotonic() + WARM_READY_TIMEOUT_S, 0
        while ready < 12:
            warm = _fresh_get(server, "/resources").json()["warm"]
            ready = ready + 1 if warm["state"] == "ready" and warm["idle"] >= 3 else 0
            assert time.monotonic() < deadline, f"the warm pool is not ready: {warm}"
            time.sleep(0.25)
        yield server
    finally:
        status = ask(socket_path(home), {"op": "status"})
        _stop_server(server)
    if status is not None:  # the last worker gone, it drains and exits (no ranks are running)
        try:
            psutil.Process(status["pid"]).wait(timeout=30)
        except psutil.NoSuchProcess:
            pass  # drained and gone already


def _warm_servers(path: str) -> list[int]:
    """The warm server processes for socket ``path`` (not their forked children)."""
    found = {}
    for proc in psutil.process_iter(["pid", "ppid", "cmdline"]):
        cmd = proc.info["cmdline"] or []
        if "service.run.warm.server" in cmd and path in cmd:
            found[proc.info["pid"]] = proc.info["ppid"]
    return sorted(pid for pid, ppid in found.items() if ppid not in found)


@pytest.mark.slow
def test_two_workers_start_one_warm_server(two_workers: LiveServer) -> None:
    path = socket_path(two_workers.home)
    assert path.startswith(str(two_workers.home.resolve())) and len(path) > 108
    status = ask(path, {"op": "status"})
    assert status is not None
    # Both workers' pools check in with this one server (each becomes one of its owners), so
    # neither has a reason to start another: then there is no other.
    workers = {p.pid for p in psutil.Process(two_workers.proc.pid).children()
               if any("spawn_main" in arg for arg in p.cmdline())}  # not a resource tracker
    assert len(workers) == 2, workers
    deadline = time.monotonic() + 30
    while not workers <= set(status["owners"]):
        assert time.monotonic() < deadline, (workers, status["owners"])
        time.sleep(0.2)
        status = ask(path, {"op": "status"})
        assert status is not None
    assert _warm_servers(path) == [status["pid"]]
    assert lock_holder(os.path.dirname(path)) == status["pid"]
    roles = {_fresh_get(two_workers, "/healthz").json()["role"] for _ in range(30)}
    assert roles == {"supervisor", "standby"}, "both workers are up, each with its pool"


def _submit_probe(server: LiveServer, env: dict[str, str]) -> tuple[int, dict, str]:
    with httpx.Client(base_url=server.url, timeout=10,
                      headers={"Authorization": f"Bearer {API_TOKEN}"}) as c:
        r = c.post("/jobs", json={"entrypoint": "probe.py", "nproc_per_node": 1, "env": env})
        assert r.status_code == 201, r.text
        job_id = r.json()["id"]
        deadline = time.monotonic() + 120
        while (job := c.get(f"/jobs/{job_id}").json())["state"] not in (
                "succeeded", "failed", "cancelled"):
            assert time.monotonic() < deadline, job
            time.sleep(0.2)
    assert job["state"] == "succeeded", job["reason"]
    logs = rank_logs(server, job_id)
    found = re.search(r"probe: (\{.*\})", logs)
    assert found, logs
    return job_id, json.loads(found.group(1)), logs


@pytest.mark.slow
def test_torch_logs_job_starts_cold_and_a_plain_one_warm(two_workers: LiveServer) -> None:
    # TORCH_LOGS is read when torch is imported: a warm process (the server imported torch)
    # would ignore it. Cold, it takes effect — and the log says why the job started cold.
    _, seen, logs = _submit_probe(two_workers, {"TORCH_LOGS": "+dynamo"})
    assert "warm start unavailable (the job sets TORCH_LOGS" in logs, logs
    assert seen["torch_logs"] == "+dynamo" and seen["dynamo_level"] == 10, seen
    # With a variable nothing reads at import, the job starts warm (its agent and its rank).
    served = ask(socket_path(two_workers.home), {"op": "status"})["served"]  # type: ignore[index]
    _, seen, logs = _submit_probe(two_workers, {"MY_SETTING": "mine"})
    assert "starting cold" not in logs, logs
    status = ask(socket_path(two_workers.home), {"op": "status"})
    assert status is not None and status["served"] >= served + 2, "agent and rank were warm"
    assert seen["my_setting"] == "mine" and seen["dynamo_level"] != 10, seen

