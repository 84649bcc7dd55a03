"""Hostile script jobs against a real server (issue 17): real torchrun groups on CPU running scripts
that leave processes behind, litter the run directory, or raise enormous exceptions.
"""

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from tests.conftest import ADOPTS_ONLY, LiveServer, _start_server, _stop_server

API_TOKEN = "hostile-scripts-api-token-0123456789"
AUTH = {"Authorization": f"Bearer {API_TOKEN}"}

ESCAPE = '''\
import os, subprocess, sys, time

import worker

worker.ready()
child = subprocess.Popen(["sleep", "300"], start_new_session=True)  # a session of its own
read, write = os.pipe()
middle = os.fork()
if middle == 0:  # the classic daemon: fork, setsid, fork, the middle one exits
    os.setsid()
    if os.fork() == 0:
        os.write(write, str(os.getpid()).encode())
        time.sleep(300)
    os._exit(0)
os.waitpid(middle, 0)
os.close(write)
daemon = int(os.read(read, 32))
with open("pids.txt", "w") as f:  # relative: the run directory
    f.write(f"{child.pid} {daemon}")
if sys.argv[1:] == ["hang"]:
    time.sleep(300)
'''

LITTER = '''\
import json, os, pathlib

import worker

worker.report(epoch=1, loss=0.5)
pathlib.Path("attempts").mkdir(exist_ok=True)
pathlib.Path("attempts/results.json").write_text(json.dumps({"best_lr": 0.1}))
pathlib.Path("attempts/2.json").write_text(json.dumps({"number": 2}))
os.makedirs("spool", exist_ok=True)
os.mkfifo("spool/rank-9.jsonl")
'''

HUGE_ERROR = '''\
import worker


@worker.record
def main() -> None:
    worker.ready()
    raise RuntimeError("R" * (8 * 1024 * 1024))


main()
'''

QUICK = '''\
import worker

worker.report(epoch=1, loss=0.25)
'''


@pytest.fixture(scope="module")
def scripts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("scripts")
    for name, text in (("escape.py", ESCAPE), ("litter.py", LITTER),
                       ("huge_error.py", HUGE_ERROR), ("quick.py", QUICK)):
        (folder / name).write_text(text)
    return folder


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, scripts: Path) -> Iterator[LiveServer]:
    srv = _start_server(tmp_path_factory.mktemp("hostile") / "home",
                        {"TORCHYARD_SCRIPT_DIRS": str(scripts),
                         "TORCHYARD_API_TOKENS": API_TOKEN,
                         # Cold: the attempt loop's subreaper must catch what escapes. (A warm rank's
                         # escapee is the warm server's to kill at once: tests/warm.)
                         "TORCHYARD_WARM_RANKS": "false"})
    yield srv
    _stop_server(srv)


def _submit(server: LiveServer, entrypoint: str, *args: str) -> int:
    with server.client() as c:
        r = c.post("/jobs", json={"entrypoint": entrypoint, "args": list(args),
                                  "nproc_per_node": 1})
        assert r.status_code == 201, r.text
        return r.json()["id"]


def _pids(server: LiveServer, job_id: int, timeout_s: float = 60) -> list[int]:
    path = server.home / "runs" / str(job_id) / "pids.txt"
    deadline = time.monotonic() + timeout_s
    while not (path.exists() and path.read_text().strip()):
        assert time.monotonic() < deadline, "the script did not start its processes"
        time.sleep(0.2)
    return [int(p) for p in path.read_text().split()]


def _alive(pids: list[int]) -> list[int]:
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    return alive


def _gone_within(pids: list[int], timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while (alive := _alive(pids)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return alive


@pytest.fixture
def reaped() -> Iterator[list[int]]:
    """Pids a test saw; whatever the outcome, none is left running after it."""
    seen: list[int] = []
    yield seen
    for pid in _alive(seen):
        psutil.Process(pid).kill()


def test_no_process_of_a_succeeded_job_survives_it(server: LiveServer, reaped: list[int]) -> None:
    job_id = _submit(server, "escape.py")
    reaped += _pids(server, job_id)
    job = server.wait_for(job_id, {"succeeded"}, timeout_s=120)
    assert job["state"] == "succeeded"
    # The slot is free once the job is terminal: nothing of the job may still run by then.
    assert _gone_within(reaped, 1) == [], "a process of the job outlived it"


def test_no_process_of_a_cancelled_job_survives_it(server: LiveServer, reaped: list[int]) -> None:
    job_id = _submit(server, "escape.py", "hang")
    reaped += _pids(server, job_id)
    assert len(_alive(reaped)) == 2
    with server.client() as c:
        assert c.post(f"/jobs/{job_id}/cancel").json()["state"] == "cancelled"
    # Stop grace 3 s (conftest) + the attempt loop's 2 s for leftovers, with room for a loaded host.
    assert _gone_within(reaped, 20) == [], "a process of the cancelled job is still running"


def test_a_huge_exception_makes_a_bounded_reason_and_page(server: LiveServer) -> None:
    job_id = _submit(server, "huge_error.py")
    job = server.wait_for(job_id, {"failed"}, timeout_s=120)
    assert job["reason"].startswith("rank 0 failed: RuntimeError: RRRR"), job["reason"][:200]
    assert len(job["reason"]) <= 2000 and "the full text is in the job's logs" in job["reason"]
    with server.client() as c:
        page = c.get("/jobs", params={"limit": 50})
        assert page.status_code == 200 and len(page.content) < 100_000, len(page.content)
        tail = c.get(f"/jobs/{job_id}/logs", params={"rank": 0, "tail": 4096}).json()
    assert "RRRR" in tail["text"] and tail["offset"] > 8_000_000, "the logs have it all"


def test_a_littered_run_directory_stops_neither_queue_nor_restart(
    live_server_factory: Callable[..., LiveServer], scripts: Path,
) -> None:
    env = {"TORCHYARD_SCRIPT_DIRS": str(scripts), "TORCHYARD_API_TOKENS": API_TOKEN}
    server = live_server_factory(**env)
    litter = _submit(server, "litter.py")
    assert server.wait_for(litter, {"succeeded"}, timeout_s=120)["state"] == "succeeded"
    after = _submit(server, "quick.py")  # the queue moves on
    assert server.wait_for(after, {"succeeded"}, timeout_s=120)["state"] == "succeeded"
    with server.client() as c:
        assert c.get("/jobs").status_code == 200
        job = c.get(f"/jobs/{litter}").json()
        assert [a["number"] for a in job["attempts"]] == [1]
        assert [m["value"] for m in c.get(f"/jobs/{litter}/metrics").json()["items"]] == [0.5]
    server.proc.terminate()
    server.proc.wait(timeout=30)
    again = live_server_factory(server.home, server.port, **env, **ADOPTS_ONLY)  # answers /healthz
    with httpx.Client(base_url=again.url, headers=AUTH, timeout=10) as c:
        assert c.get(f"/jobs/{litter}").json()["state"] == "succeeded"
