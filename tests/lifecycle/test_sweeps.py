"""Sweeps (issue 26): real sweeps on a real server — the built-in digits trainer with tiny epochs,
a script with placeholders whose ranks disagree, ASHA pruning, a server killed mid-sweep, and
the 422s of bad sweep specs. One warm-rank server is shared by the module."""

import math
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import pytest

from tests.conftest import LiveServer, _start_server, _stop_server, add_script
from tests.warm.warmjobs import wait_warm

SWEEP_TIMEOUT_S = 240.0

# A script trial: its lr comes from the placeholder in argv and, the same, from worker.params();
# rank r reports loss lr * (1 + 2r): rank 0 alone would say lr, the two ranks' mean says 2 * lr.
SCRIPT = '''\
import os
import sys

import worker

lr = float(sys.argv[1].removeprefix("--lr="))
assert worker.params() == {"lr": lr}, (worker.params(), lr)
rank = int(os.environ["RANK"])
for epoch in (1, 2):
    worker.report(epoch=epoch, loss=lr * (1 + 2 * rank) / epoch)
'''

BUILTIN = {"dataset": "digits", "model": "mlp", "epochs": 2, "batch_size": 256, "device": "cpu",
           "checkpoint_every": 0}


@pytest.fixture
def server(shared_script_server: LiveServer) -> LiveServer:
    """The session's shared script server (warm ranks); a sweep's trials are read by id."""
    add_script(shared_script_server, "trial.py", SCRIPT)
    wait_warm(shared_script_server, idle=2)
    return shared_script_server


def wait_sweep(server: LiveServer, sweep_id: int, timeout_s: float = SWEEP_TIMEOUT_S,
               until: Callable[[dict], bool] | None = None) -> dict:
    """Poll until the sweep ended (or ``until`` holds); the server must stay up."""
    deadline = time.monotonic() + timeout_s
    with server.client() as c:
        while True:
            assert server.proc.poll() is None, f"server died:\n{server.log.read_text()[-3000:]}"
            sweep = c.get(f"/sweeps/{sweep_id}").json()
            if (until(sweep) if until else sweep["state"] != "running"):
                return sweep
            assert time.monotonic() < deadline, f"sweep {sweep_id} did not end: {sweep}"
            time.sleep(0.3)


def create(server: LiveServer, body: dict) -> dict:
    with server.client() as c:
        r = c.post("/sweeps", json=body)
    assert r.status_code == 201, r.text
    return r.json()


@pytest.mark.slow
def test_grid_of_four_completes_with_the_right_best(server: LiveServer) -> None:
    lrs = [0.001, 0.01, 0.1, 0.5]
    sweep = create(server, {
        "name": "grid", "spec": {**BUILTIN, "priority": 7}, "method": "grid", "parallel": 2,
        "space": {"lr": {"type": "choice", "values": lrs}},
    })
    assert sweep["state"] == "running" and sweep["spec"]["max_trials"] is None
    done = wait_sweep(server, sweep["id"])
    assert done["state"] == "succeeded", done
    trials = done["trials"]
    assert sorted(t["params"]["lr"] for t in trials) == lrs  # every point once
    assert {t["outcome"] for t in trials} == {"completed"}
    assert done["counts"]["completed"] == 4
    values = {t["job_id"]: t["value"] for t in trials}
    best_id = min(values, key=values.__getitem__)
    assert done["best"]["job_id"] == best_id and done["best"]["value"] == values[best_id]
    assert done["best"]["params"]["lr"] == max(lrs)  # 2 epochs of SGD: the largest lr wins
    with server.client() as c:
        for t in trials:
            job = c.get(f"/jobs/{t['job_id']}").json()
            # A trial is a job: the sweep's priority, its parameters, its lr in the spec.
            assert job["sweep_id"] == sweep["id"] and job["params"] == t["params"]
            assert job["spec"]["priority"] == 7 and job["spec"]["lr"] == t["params"]["lr"]
            assert job["spec"]["labels"]["sweep"] == str(sweep["id"])
            assert [e["epoch"] for e in t["epochs"]] == [1, 2]
            assert t["value"] == t["epochs"][-1]["value"]
        listed = c.get("/sweeps", params={"limit": 1}).json()
    assert listed["items"][0]["id"] >= sweep["id"]


def test_script_sweep_fills_placeholders_and_judges_every_rank(server: LiveServer) -> None:
    sweep = create(server, {
        "name": "script", "method": "random", "max_trials": 2, "parallel": 2, "seed": 3,
        "spec": {"entrypoint": "trial.py", "args": ["--lr={lr}"], "nproc_per_node": 2,
                 "device": "cpu"},
        "space": {"lr": {"type": "uniform", "low": 0.1, "high": 1.0}},
    })
    done = wait_sweep(server, sweep["id"])
    assert done["state"] == "succeeded", done
    assert len(done["trials"]) == 2
    for t in done["trials"]:
        lr = t["params"]["lr"]
        assert t["outcome"] == "completed", t
        # The reduced (mean) value of both ranks, not rank 0's lr.
        assert [e["value"] for e in t["epochs"]] == pytest.approx([2 * lr, lr])
        assert t["value"] == pytest.approx(lr)


def _at(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


@pytest.mark.slow
def test_random_sweep_with_asha_prunes_and_refills_at_once(server: LiveServer) -> None:
    sweep = create(server, {
        "name": "asha", "method": "random", "max_trials": 12, "parallel": 2, "seed": 1,
        "spec": {**BUILTIN, "epochs": 4},
        "space": {"lr": {"type": "log_uniform", "low": 1e-4, "high": 1.0}},
        "prune": {"type": "asha", "min_epochs": 1, "reduction_factor": 2},
        "objective": {"metric": "loss", "mode": "min"},
    })
    done = wait_sweep(server, sweep["id"], timeout_s=2 * SWEEP_TIMEOUT_S)
    assert done["state"] == "succeeded", done
    trials = done["trials"]
    assert len(trials) == 12 and len({t["job_id"] for t in trials}) == 12
    pruned = [t for t in trials if t["outcome"] == "pruned"]
    assert pruned, [(t["params"], t["outcome"], t["value"]) for t in trials]
    assert done["counts"]["pruned"] == len(pruned) and done["counts"]["failed"] == 0
    with server.client() as c:
        jobs = {t["job_id"]: c.get(f"/jobs/{t['job_id']}").json() for t in trials}
    for t in pruned:
        job = jobs[t["job_id"]]
        assert job["state"] == "cancelled"  # stopped like a cancel, not failed
        assert t["reason"].startswith("pruned by ASHA at epoch "), t["reason"]
        assert "cutoff" in t["reason"]
        epoch = int(re.match(r"pruned by ASHA at epoch (\d+):", t["reason"])[1])  # type: ignore[index]
        assert [e["epoch"] for e in t["epochs"]] == list(range(1, epoch + 1))  # cut there
    # The pruned trial's slot went to the next trial at once: a trial was made right after.
    first = min(pruned, key=lambda t: t["job_id"])
    ended = _at(jobs[first["job_id"]]["ended_at"])
    later = [_at(j["created_at"]) for j in jobs.values() if j["id"] > first["job_id"]]
    if later:  # (none when the last trial was the one pruned)
        assert min(abs(t - ended) for t in later) < 2.0


def test_cancel_stops_queued_and_running_trials(server: LiveServer) -> None:
    sweep = create(server, {
        "name": "cancel", "method": "random", "max_trials": 6, "parallel": 2,
        "spec": {**BUILTIN, "epochs": 50},
        "space": {"lr": {"type": "uniform", "low": 0.01, "high": 0.1}},
    })
    wait_sweep(server, sweep["id"], until=lambda s: s["counts"]["running"] >= 1)
    with server.client() as c:
        r = c.post(f"/sweeps/{sweep['id']}/cancel")
        assert r.status_code == 200 and r.json()["state"] == "cancelled"
        for t in r.json()["trials"]:
            server.wait_for(t["job_id"], {"cancelled"}, timeout_s=60)
    # A driver step after the cancel makes no new trial: a sweep created now gets its first
    # trial in such a step (each step advances every running sweep, oldest first), so once it
    # has one, that step had this sweep's turn first, and made nothing for it.
    marker = create(server, {
        "name": "after-cancel", "method": "random", "max_trials": 1, "parallel": 1,
        "spec": {**BUILTIN, "epochs": 1},
        "space": {"lr": {"type": "uniform", "low": 0.01, "high": 0.1}},
    })
    wait_sweep(server, marker["id"], until=lambda s: len(s["trials"]) >= 1)
    with server.client() as c:
        c.post(f"/sweeps/{marker['id']}/cancel")
    after = wait_sweep(server, sweep["id"])
    assert after["state"] == "cancelled" and len(after["trials"]) <= 2


@pytest.mark.parametrize(("patch", "field"), [
    ({"space": {}}, "space"),
    ({"space": {"nosuchfield": {"type": "uniform", "low": 0, "high": 1}}}, "space.nosuchfield"),
    ({"parallel": 0}, "parallel"),
    ({"bogus": 1}, "bogus"),
    ({"space": {"lr": {"type": "uniform", "low": 0.1, "high": 500}}}, "space.lr"),
    ({"spec": {"entrypoint": "trial.py", "args": ["--lr={lr}", "--wd={wd}"]},
      "space": {"lr": {"type": "uniform", "low": 0.1, "high": 1}}}, "spec.args.1"),
    ({"method": "grid"}, "space.lr.type"),
])
def test_bad_sweep_specs_are_422_naming_the_field(
    server: LiveServer, patch: dict, field: str
) -> None:
    body = {"spec": BUILTIN, "space": {"lr": {"type": "uniform", "low": 0.01, "high": 0.1}},
            **patch}
    with server.client() as c:
        r = c.post("/sweeps", json=body)
    assert r.status_code == 422, r.text
    fields = [d["field"] for d in r.json()["details"]]
    assert field in fields, r.json()


@pytest.mark.slow
def test_sweep_survives_a_server_kill(tmp_path: Path) -> None:
    """SIGKILL the server mid-sweep, start it again on the same home: the sweep finishes with
    max_trials distinct trials, none lost, none run twice."""
    first = _start_server(tmp_path / "home", {})
    second = None
    try:
        sweep = create(first, {
            "name": "restart", "method": "random", "max_trials": 4, "parallel": 2, "seed": 5,
            "spec": {**BUILTIN, "epochs": 3},
            "space": {"lr": {"type": "log_uniform", "low": 0.01, "high": 0.5}},
            "prune": {"type": "median", "startup_trials": 10},
        })
        wait_sweep(first, sweep["id"], until=lambda s: s["counts"]["running"] >= 1)
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait()
        second = _start_server(tmp_path / "home", {}, first.port)
        done = wait_sweep(second, sweep["id"], timeout_s=2 * SWEEP_TIMEOUT_S)
    finally:
        for s in (first, second):
            if s is not None:
                _stop_server(s)
    assert done["state"] == "succeeded", done
    trials = done["trials"]
    assert len(trials) == 4 and len({t["job_id"] for t in trials}) == 4
    assert len({t["params"]["lr"] for t in trials}) == 4  # no point drawn twice
    assert all(t["outcome"] == "completed" for t in trials), trials
    assert all(math.isfinite(t["value"]) for t in trials)


@pytest.mark.slow
def test_cli_sweep_create_follow_and_show(server: LiveServer, tmp_path: Path) -> None:
    spec = tmp_path / "sweep.yaml"
    spec.write_text(
        "name: cli\nmethod: grid\nparallel: 2\n"
        "spec: {dataset: digits, epochs: 1, batch_size: 256, device: cpu, checkpoint_every: 0}\n"
        "space: {lr: {type: choice, values: [0.01, 0.2]}}\n"
    )
    cli = [sys.executable, "-m", "service", "sweep"]
    auth = ["--url", server.url, "--token", server.token or ""]
    done = subprocess.run([*cli, "create", str(spec), "--follow", *auth],
                          capture_output=True, text=True, timeout=SWEEP_TIMEOUT_S)
    assert done.returncode == 0, done.stdout + done.stderr
    sweep_id = int(re.search(r"sweep (\d+) created", done.stdout)[1])  # type: ignore[index]
    assert "succeeded" in done.stdout and "best" in done.stdout
    shown = subprocess.run([*cli, "show", str(sweep_id), *auth],
                           capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert "completed 2" in shown.stdout and "lr=0.2" in shown.stdout
