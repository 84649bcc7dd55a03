"""Hangs that name the stuck rank, and stacks on demand (issue 25, item 4): real 2-rank torchrun
script jobs on gloo; py-spy from the venv (docs/lifecycle.md, "Hang diagnosis")."""

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path

import httpx
import pytest

from service.api.stacksgate import StacksBusy, StacksGate
from service.run.stackdump import classify, describe_hang
from service.settings import Settings
from tests.conftest import (
    LOOPBACK_TLS,
    REPO_ROOT,
    LiveServer,
    _start_server,
    _stop_server,
    add_script,
)
from tests.slurmcluster import SlurmCluster

API_TOKEN = "stacks-api-token-0123456789abcdef0123"

# "hang": rank 1 sleeps in load_batch at step 2 while rank 0 waits in all_reduce; each rank also
# leaves a file where NCCL's Flight Recorder would dump (gloo has none), its variables inside.
# "forever": both ranks keep all-reducing (a running job to take stacks of).
SCRIPT = '''
import os, sys, time
import torch
import torch.distributed as dist
import worker

MODE = sys.argv[1]
RANK = int(os.environ["RANK"])


def load_batch(step):
    if MODE == "hang" and RANK == 1 and step == 2:
        time.sleep(3600)  # HANG-LINE
    return torch.ones(4)


def main():
    dist.init_process_group("gloo")
    if MODE == "hang":
        dump = os.environ["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] + str(RANK)
        with open(dump, "w") as f:
            f.write(os.environ["TORCH_NCCL_TRACE_BUFFER_SIZE"] + " "
                    + os.environ["TORCH_NCCL_DUMP_ON_TIMEOUT"])
    step = 0
    while MODE == "forever" or step < 6:
        worker.ready()
        t = load_batch(step)
        dist.all_reduce(t)
        time.sleep(0.1)
        step += 1
    dist.destroy_process_group()


main()
'''
HANG_LINE = next(i for i, line in enumerate(SCRIPT.splitlines(), 1) if "HANG-LINE" in line)


def _server(tmp_path_factory: pytest.TempPathFactory, **env: str) -> LiveServer:
    scripts = tmp_path_factory.mktemp("stack-scripts")
    (scripts / "hang.py").write_text(SCRIPT)
    return _start_server(tmp_path_factory.mktemp("stacks") / "home",
                         {"TORCHYARD_SCRIPT_DIRS": str(scripts),
                          "TORCHYARD_API_TOKENS": API_TOKEN, **env})


@pytest.fixture
def server(shared_script_server: LiveServer) -> LiveServer:
    """Warm ranks (the default): the ranks are the warm server's processes, not the attempt loop's.
    The session's shared script server: this file's jobs are read by id."""
    add_script(shared_script_server, "hang.py", SCRIPT)
    return shared_script_server


@pytest.fixture(scope="module")
def cold_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """Cold ranks: found below the job's attempt loop."""
    srv = _server(tmp_path_factory, TORCHYARD_WARM_RANKS="false")
    yield srv
    _stop_server(srv)


def _token(server: LiveServer) -> str:
    """The API token the server takes (this file's own servers, or the shared one's)."""
    return server.token or API_TOKEN


def _submit(server: LiveServer, mode: str, heartbeat_timeout_s: float | None) -> int:
    with server.client() as c:
        r = c.post("/jobs", json={"entrypoint": "hang.py", "args": [mode], "nproc_per_node": 2,
                                  "heartbeat_timeout_s": heartbeat_timeout_s})
        assert r.status_code == 201, r.text
        return r.json()["id"]


def _wait_ready(server: LiveServer, job_id: int, timeout_s: float = 120) -> None:
    """Running, and both ranks past set-up (their ready markers exist)."""
    server.wait_for(job_id, {"running"}, timeout_s=timeout_s)
    attempt = server.home / "runs" / str(job_id) / "attempts" / "1"
    deadline = time.monotonic() + timeout_s
    while not all((attempt / f"ready-rank-{r}").exists() for r in (0, 1)):
        assert time.monotonic() < deadline, "ranks did not get ready"
        time.sleep(0.1)


def test_hang_names_the_stuck_rank_and_its_line(server: LiveServer) -> None:
    job_id = _submit(server, "hang", heartbeat_timeout_s=4)
    job = server.wait_for(job_id, {"failed"}, timeout_s=180)
    reason = job["reason"]
    assert reason.startswith(
        f"heartbeat timeout: rank 1 not in a collective, at hang.py:{HANG_LINE} in load_batch; "
        "ranks 0 waiting in all_reduce"), reason
    assert "made no progress for 4 s" in reason
    [attempt] = job["attempts"]
    by_rank = {r["rank"]: r for r in attempt["stacks"]["ranks"]}
    assert by_rank[0]["state"] == "collective" and by_rank[0]["collective"] == "all_reduce"
    assert by_rank[1]["state"] == "elsewhere"
    assert by_rank[1]["where"] == f"hang.py:{HANG_LINE} in load_batch"
    # The full stacks are kept with the attempt.
    with server.client() as c:
        kept = c.get(f"/jobs/{job_id}/stacks", params={"attempt": 1})
        assert kept.status_code == 200, kept.text
        body = kept.json()
        assert body["trigger"] == "heartbeat timeout" and body["error"] is None
        main = next(t for t in body["ranks"][1]["threads"] if t["name"] == "MainThread")
        assert [f["name"] for f in main["frames"][:2]] == ["load_batch", "main"]
        assert c.get(f"/jobs/{job_id}/stacks", params={"attempt": 2}).status_code == 404
        assert c.get(f"/jobs/{job_id}/stacks").status_code == 409  # not running now
    _dashboard_shows_where_ranks_were(server, job_id)
    # Flight Recorder: the variables were set, the dumps are kept with the attempt.
    kept_dumps = server.home / "runs" / str(job_id) / "stacks" / "attempt-1-flight-recorder"
    assert sorted(p.name for p in kept_dumps.iterdir()) == ["rank_0", "rank_1"]
    assert (kept_dumps / "rank_1").read_text() == "2000 1"


@pytest.mark.parametrize("ranks", ["warm", "cold"])
def test_stacks_on_demand_for_a_running_job(ranks: str, request: pytest.FixtureRequest) -> None:
    server: LiveServer = request.getfixturevalue("server" if ranks == "warm" else "cold_server")
    job_id = _submit(server, "forever", heartbeat_timeout_s=None)
    try:
        _wait_ready(server, job_id)
        with server.client() as c:
            started = time.monotonic()
            r = c.get(f"/jobs/{job_id}/stacks")
            took = time.monotonic() - started
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["trigger"] == "request" and body["attempt"] == 1 and body["error"] is None
        assert [rank["rank"] for rank in body["ranks"]] == [0, 1]
        for rank in body["ranks"]:
            assert rank["error"] is None and rank["state"] in {"collective", "elsewhere"}
            assert any(t["name"] == "MainThread" and t["frames"] for t in rank["threads"])
            assert rank["where"] and rank["where"].startswith("hang.py:")
        assert took < 10, took
        # The CLI: one line per rank, then its threads.
        out = subprocess.run(
            [sys.executable, "-m", "service", "stacks", str(job_id)], cwd=REPO_ROOT,
            env={**os.environ, "TORCHYARD_URL": server.url, "TORCHYARD_TOKEN": _token(server),
                 "COLUMNS": "200"},
            capture_output=True, text=True, timeout=120, check=False,
        )
        assert out.returncode == 0, out.stderr
        assert "rank 0 (pid " in out.stdout and "rank 1 (pid " in out.stdout, out.stdout
        assert "thread MainThread" in out.stdout and "hang.py:" in out.stdout, out.stdout
    finally:
        with server.client() as c:
            c.post(f"/jobs/{job_id}/cancel")
        server.wait_for(job_id, {"cancelled"}, timeout_s=60)


def test_stacks_calls_for_a_stopped_attempt_loop_are_bounded_and_hold_no_thread(server: LiveServer) -> None:
    """A job can stop its own attempt loop (SIGSTOP: its pid is in the claim file); then every stacks
    call waits its whole deadline. 50 such calls held all 40 threads of the pool for 15 s each
    and the API stalled (issue 44, item 6). Now the calls beyond the per-job bound are 429 with
    Retry-After at once, the ones waiting hold no thread (a route on the pool answers while they
    wait), and once the attempt loop goes on they are answered."""
    calls = 50
    per_job = Settings.model_fields["stacks_per_job"].default  # the shared server's
    job_id = _submit(server, "forever", heartbeat_timeout_s=None)
    loop_pid: int | None = None
    try:
        _wait_ready(server, job_id)
        claim = json.loads((server.home / "runs" / str(job_id) / "claim.json").read_text())
        loop_pid = int(claim["pid"])
        os.kill(loop_pid, signal.SIGSTOP)
        headers = {"Authorization": f"Bearer {server.token}"} if server.token else {}
        with httpx.Client(base_url=server.url, timeout=60, headers=headers, verify=LOOPBACK_TLS,
                          limits=httpx.Limits(max_connections=calls + 4)) as c, \
                ThreadPoolExecutor(calls) as pool:
            stacks = [pool.submit(c.get, f"/jobs/{job_id}/stacks") for _ in range(calls)]
            refused = _await_done(stacks, calls - per_job)
            for answer in refused:
                assert answer.status_code == 429, answer.text
                assert answer.json()["error"] == "too_many_requests", answer.text
                assert 1 <= int(answer.headers["Retry-After"]) <= 15, answer.headers
            # A route on the thread pool answers while the per-job bound's calls still wait.
            unrelated = c.get(f"/jobs/{job_id}")
            assert unrelated.status_code == 200 and unrelated.json()["state"] == "running"
            waiting = [f for f in stacks if not f.done()]
            assert len(waiting) == per_job, [f.result().status_code for f in stacks if f.done()]
            os.kill(loop_pid, signal.SIGCONT)
            loop_pid = None
            for f in waiting:  # the attempt loop answers them (one snapshot for both)
                answer = f.result()
                assert answer.status_code == 200, answer.text
                assert [rank["rank"] for rank in answer.json()["ranks"]] == [0, 1]
            # Their slots are free again.
            assert c.get(f"/jobs/{job_id}/stacks").status_code == 200
    finally:
        if loop_pid is not None:
            os.kill(loop_pid, signal.SIGCONT)
        with server.client() as c:
            c.post(f"/jobs/{job_id}/cancel")
        server.wait_for(job_id, {"cancelled"}, timeout_s=60)


def _await_done(futures: list[Future], count: int, timeout_s: float = 60) -> list[httpx.Response]:
    """The answers of the first ``count`` of ``futures`` to end (fails past ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    while True:
        done = [f for f in futures if f.done()]
        if len(done) >= count:
            return [f.result() for f in done]
        left = deadline - time.monotonic()
        assert left > 0, f"{len(done)} of {len(futures)} calls answered, not {count}"
        wait([f for f in futures if not f.done()], timeout=left, return_when=FIRST_COMPLETED)


def test_stacks_gate_bounds_per_job_and_in_all() -> None:
    """The bounds themselves: per job, in all, Retry-After from the first call in the way."""
    gate = StacksGate(per_job=2, in_flight=3)
    with gate.slot(1, 15), gate.slot(1, 10):
        with pytest.raises(StacksBusy) as busy:
            with gate.slot(1, 15):
                pass
        assert busy.value.retry_after_s == 10 and "TORCHYARD_STACKS_PER_JOB=2" in str(busy.value)
        with gate.slot(2, 15):
            with pytest.raises(StacksBusy) as busy:
                with gate.slot(3, 15):
                    pass
            assert "TORCHYARD_STACKS_IN_FLIGHT=3" in str(busy.value)
        with gate.slot(3, 15):  # job 2's call ended: a slot is free
            pass
    with gate.slot(1, 15), gate.slot(1, 15):  # job 1's calls ended too
        pass


def test_stacks_unavailable_say_why(tmp_path_factory: pytest.TempPathFactory) -> None:
    srv = _server(tmp_path_factory, TORCHYARD_STACK_SAMPLER="/nonexistent/py-spy")
    try:
        job_id = _submit(srv, "hang", heartbeat_timeout_s=4)
        _wait_ready(srv, job_id)
        with srv.client() as c:
            r = c.get(f"/jobs/{job_id}/stacks")
        assert r.status_code == 503, r.text
        assert "the stack sampler '/nonexistent/py-spy' was not found" in r.json()["message"]
        job = srv.wait_for(job_id, {"failed"}, timeout_s=120)
        assert job["reason"] == (
            "heartbeat timeout: rank 0 made no progress for 4 s (stacks not taken: the stack "
            "sampler '/nonexistent/py-spy' was not found)"), job["reason"]
        assert job["attempts"][0]["stacks"]["error"].startswith("the stack sampler")
    finally:
        _stop_server(srv)


def test_classify_and_describe() -> None:
    """The pure parts: a rank inside c10d is waiting; the innermost user frame is named."""
    c10d = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"
    waiting = [{"name": "MainThread", "active": False, "frames": [
        {"name": "all_reduce", "file": c10d, "line": 2500},
        {"name": "wrapper", "file": "/venv/lib/python3.11/site-packages/torch/distributed/"
                                    "c10d_logger.py", "line": 80},
        {"name": "main", "file": "/jobs/train.py", "line": 42},
    ]}]
    assert classify(waiting) == {"state": "collective", "collective": "all_reduce",
                                 "where": "train.py:42 in main"}
    stuck = [{"name": "MainThread", "active": True, "frames": [
        {"name": "sleep", "file": "<built-in>", "line": None},
        {"name": "load_batch", "file": "/jobs/train.py", "line": 7},
    ]}]
    assert classify(stuck)["state"] == "elsewhere"
    # torch frames outside the user's code (torchrun's @record around main) are not a collective.
    wrapped = [{"name": "MainThread", "active": False, "frames": [
        *stuck[0]["frames"],
        {"name": "record.<locals>.wrap.<locals>.wrapper", "line": 380,
         "file": "/venv/lib/python3.11/site-packages/torch/distributed/elastic/multiprocessing/"
                 "errors/__init__.py"},
    ]}]
    assert classify(wrapped) == {"state": "elsewhere", "collective": None,
                                 "where": "train.py:7 in load_batch"}
    snapshot = {"error": None, "ranks": [
        {"rank": 0, **classify(waiting)}, {"rank": 1, **classify(stuck)},
        {"rank": 2, **classify(waiting)}]}
    assert describe_hang(snapshot, "x") == (
        "heartbeat timeout: rank 1 not in a collective, at train.py:7 in load_batch; "
        "ranks 0, 2 waiting in all_reduce (x)")


def _dashboard_shows_where_ranks_were(server: LiveServer, job_id: int) -> None:
    """The job page lists, under the attempt, where each rank was at the hang."""
    from tests.dashboard.browser import CHROMIUM, CHROMIUM_ARGS

    if not CHROMIUM.exists():
        return  # browser checks need Debian's Chromium (tests/dashboard/browser.py)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS,
                                     headless=True)
        try:
            page = browser.new_page()
            page.set_default_timeout(60_000)
            page.add_init_script(f"localStorage.setItem('torchyard.token', '{_token(server)}')")
            page.goto(f"{server.url}/#/jobs/{job_id}")
            page.wait_for_function(
                "(r) => document.getElementById('attempts')?.innerText?.includes(r)",
                arg=f"rank 1: not in a collective, at hang.py:{HANG_LINE} in load_batch")
            assert "rank 0: waiting in all_reduce" in page.locator("#attempts").inner_text()
        finally:
            browser.close()


def test_hang_and_stacks_on_slurm(
    tmp_path: Path, slurm: SlurmCluster, slurm_server: Callable[..., LiveServer]
) -> None:
    """Through the Slurm executor, 2 nodes × 1 rank: the attempt loop takes each node's stacks with a
    step overlapping the attempt's (``srun --overlap``), on demand and at the hang."""
    (tmp_path / "hang.py").write_text(SCRIPT)
    server = slurm_server(TORCHYARD_SCRIPT_DIRS=str(tmp_path), TORCHYARD_API_TOKENS=API_TOKEN)
    with server.client() as c:
        r = c.post("/jobs", json={"entrypoint": "hang.py", "args": ["hang"], "nnodes": 2,
                                  "nproc_per_node": 1, "device": "cpu",
                                  "heartbeat_timeout_s": 8})
        assert r.status_code == 201, r.text
        job_id = r.json()["id"]
        _wait_ready(server, job_id)
        now = c.get(f"/jobs/{job_id}/stacks", timeout=60)
        assert now.status_code == 200, now.text
        assert [rank["rank"] for rank in now.json()["ranks"]] == [0, 1], now.json()
    job = server.wait_for(job_id, {"failed"}, timeout_s=180)
    assert job["reason"].startswith(
        f"heartbeat timeout: rank 1 not in a collective, at hang.py:{HANG_LINE} in load_batch; "
        "ranks 0 waiting in all_reduce"), job["reason"]


def test_a_sampler_refused_ptrace_says_so(tmp_path: Path) -> None:
    """What py-spy prints without ptrace rights becomes a reason naming the cure."""
    from service.run.stackdump import _sampler_error

    why = _sampler_error("Error: Permission Denied: Try running again with elevated permissions")
    assert why.startswith("no ptrace rights over the rank (") and "CAP_SYS_PTRACE" in why
    assert describe_hang({"error": why, "ranks": []}, "rank 0 made no progress for 5 s") == (
        f"heartbeat timeout: rank 0 made no progress for 5 s (stacks not taken: {why})")
