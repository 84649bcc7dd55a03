"""Loss guards (``nonfinite_patience``, ``divergence_patience``): real jobs stopped early, failed
with a reason naming the rank, epoch and value; their records kept. Plus the streak rules, and
the finisher naming the stopped attempt whichever way the stop reached the attempt loop."""

import json
import math
import time
from pathlib import Path

import httpx
import psutil
import pytest
from sqlalchemy import event
from sqlalchemy.orm import Session

from service.domain.loop.finisher import Finisher
from service.domain.records.lossguard import divergence_trip, nonfinite_reason, nonfinite_trip
from service.store import repository as repo
from tests.conftest import REPO_ROOT, LiveServer, add_script, cli
from torchyard_contract.rundir import RunDir
from torchyard_contract.spec import JobSpec
from torchyard_contract.state import JobState

NAN = math.nan
LONG = 40  # epochs a stopped job would have run: it must end long before
STOPPED_WITHIN_S = 30  # the servers' stop grace is 3 s (conftest)


@pytest.fixture
def server(shared_script_server: LiveServer) -> LiveServer:
    add_script(shared_script_server, "losses.py",
               (REPO_ROOT / "tests" / "jobs" / "losses.py").read_text())
    return shared_script_server


def _losses(*per_rank: str) -> list[str]:
    return [";".join(per_rank)]


def _script_job(c: httpx.Client, args: list[str], **spec: object) -> int:
    r = c.post("/jobs", json={"entrypoint": "losses.py", "args": args, **spec})
    assert r.status_code == 201, r.text
    return r.json()["id"]


def _assert_stopped(server: LiveServer, job: dict) -> None:
    """Failed well before its last epoch; its group is stopped (SIGTERM → grace → SIGKILL) and
    its resources freed within the grace period, as after a cancel."""
    assert job["pid"] is not None
    deadline = time.monotonic() + STOPPED_WITHIN_S
    with server.client() as c:  # its own resources: the server may be shared
        while _alive(job["pid"]) or any(
            i["job_id"] == job["id"] for i in c.get("/resources").json()["items"]
        ):
            assert time.monotonic() < deadline, "the job's group was not stopped"
            time.sleep(0.2)
        records = c.get(f"/jobs/{job['id']}/metrics", params={"name": "loss"}).json()["items"]
        # The resources are freed as soon as the group ends; the finisher closes its attempt
        # record just after (service.domain.loop.finisher).
        while (final := c.get(f"/jobs/{job['id']}").json())["attempts"][-1]["ended_at"] is None:
            assert time.monotonic() < deadline, final["attempts"]
            time.sleep(0.1)
    assert final["state"] == "failed" and final["reason"] == job["reason"], "stays failed"
    last = final["attempts"][-1]
    assert last["ended_at"] is not None and last["reason"] == job["reason"], last
    assert max(m["epoch"] for m in records) < LONG // 2, "stopped early, not run to the end"


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


# --- rules ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "patience", "expected"),
    [
        ({1: 1.0, 2: NAN}, 1, 2),
        ({1: NAN, 2: 1.0, 3: NAN}, 2, None),  # not in a row
        ({1: NAN, 2: math.inf, 3: 1.0}, 2, 2),
        ({1: NAN, 3: NAN}, 2, None),  # epoch 2 missing: not consecutive
        ({4: 1.0, 5: -math.inf, 6: NAN, 7: NAN}, 3, 7),
        ({1: 1.0, 2: 2.0}, 1, None),
    ],
)
def test_nonfinite_streak(values: dict[int, float], patience: int, expected: int | None) -> None:
    assert nonfinite_trip(values, patience) == expected


def test_divergence_streak_counts_complete_epochs_of_the_same_rank() -> None:
    ok, off = {0: 1.0, 1: 1.1}, {0: 1.0, 1: 10.0}
    assert divergence_trip({1: off, 2: off}, 2, 2) == (1, 2)
    assert divergence_trip({1: off, 2: ok, 3: off}, 2, 2) is None
    assert divergence_trip({1: off, 2: {0: 1.0}}, 2, 2) is None, "epoch 2 is not complete"
    assert divergence_trip({1: off, 3: off}, 2, 2) is None, "not consecutive"
    assert divergence_trip({1: {0: 10.0, 1: 1.0}, 2: off}, 2, 2) is None, "different ranks"


def test_reason_names_rank_epoch_and_value() -> None:
    assert nonfinite_reason(0, 1, NAN, 1) == "rank 0 reported loss NaN at epoch 1"
    assert nonfinite_reason(3, 7, -math.inf, 2) == (
        "rank 3 reported loss -Infinity at epoch 7 (non-finite 2 epochs in a row)"
    )


def test_patience_bounds_are_422_naming_the_field(api) -> None:  # type: ignore[no-untyped-def]
    for field, value in (("nonfinite_patience", 0), ("divergence_patience", 10_001),
                         ("nonfinite_patience", "x")):
        r = api.post("/jobs", json={"dataset": "synthetic", field: value})
        assert r.status_code == 422 and r.json()["details"][0]["field"] == field, r.text
    spec = api.post("/jobs", json={"dataset": "synthetic"}).json()["spec"]
    assert (spec["nonfinite_patience"], spec["divergence_patience"]) == (1, None)


# The attempt loop's outcome of a guard's stop, in each order the stop can reach it: the SIGTERM first
# (a cancel), torchrun first (exit 1 from the ranks' SIGTERM, before the attempt loop saw the
# stop: the flake this test pins down), or the job's own end just after the guard tripped.
TORCHRUN_EXIT = "rank 0 failed: SignalException: Process 7 got signal: 15 (torchrun exited with code 1)"


@pytest.mark.parametrize(("state", "code", "loop_reason"), [
    ("cancelled", -15, "cancelled by user"),
    ("failed", 1, TORCHRUN_EXIT),
    ("succeeded", 0, None),
], ids=["sigterm-first", "torchrun-first", "ended-first"])
def test_a_guards_stop_names_the_last_attempt_whatever_the_attempt_loop_saw_first(
    api, state: str, code: int, loop_reason: str | None,  # type: ignore[no-untyped-def]
) -> None:
    """The finisher on a migrated store, the job as the supervisor leaves it: the guard's stop
    request noted and the job failed with it (``service.domain.loop.stops``), then the attempt loop's files."""
    reason = nonfinite_reason(0, 1, NAN, 1)
    with api.app.state.session_factory() as session:
        job_id = repo.create_job(session, JobSpec.model_validate({"dataset": "synthetic"}),
                                 None).id
        assert repo.transition(session, job_id, JobState.starting)
        assert repo.transition(session, job_id, JobState.running)
        assert repo.request_stop(session, job_id, reason)
        assert repo.transition(session, job_id, JobState.failed, reason=reason)
        session.commit()
    run = RunDir.for_job(api.app.state.settings.runs_dir, job_id)
    run.attempts_dir.mkdir(parents=True)
    run.attempt_file(1).write_text(json.dumps({
        "number": 1, "started_at": 1.0, "ended_at": 2.0, "exit_code": code,
        "reason": loop_reason, "startup_failure": False}))
    run.exit_file.write_text(json.dumps({"state": state, "exit_code": code,
                                         "reason": loop_reason}))
    factory = api.app.state.session_factory
    committed: list[list[str | None]] = []  # the job's attempt reasons after each commit

    def observed() -> Session:
        """The store's own sessions; after each commit, the job's attempts as a reader sees them."""
        session = factory()

        def read_back(_: Session) -> None:
            with factory() as reader:
                job = repo.get_job(reader, job_id)
                committed.append([a.get("reason") for a in (job.attempts or [])] if job else [])

        event.listen(session, "after_commit", read_back)
        return session

    Finisher(runs_dir=api.app.state.settings.runs_dir, session_factory=observed,
             max_records_per_rank=1000).finish(job_id, 0)
    job = api.get(f"/jobs/{job_id}").json()
    assert job["state"] == "failed" and job["reason"] == reason, job
    assert [a["reason"] for a in job["attempts"]] == [reason], job["attempts"]
    # Never the attempt loop's account in between: a reader polling the job saw the guard's reason on
    # the last attempt from the first commit that stored it (the flake of a live loss-guard test).
    assert committed and all(r in ([], [reason]) for r in committed), committed


# --- real jobs -----------------------------------------------------------------------------------


def test_builtin_nan_loss_stops_the_job_at_epoch_1(shared_server: LiveServer) -> None:
    """``lr: 90`` on ``synthetic`` gives NaN from epoch 1: failed at once, not 40 green epochs."""
    live_server = shared_server
    spec = {"name": "nan", "dataset": "synthetic", "lr": 90, "epochs": LONG}
    with live_server.client() as c:
        job_id = c.post("/jobs", json=spec).json()["id"]
    job = live_server.wait_for(job_id, {"failed"}, timeout_s=180)
    assert job["reason"] == "rank 0 reported loss NaN at epoch 1", job
    with live_server.client() as c:
        first = c.get(f"/jobs/{job_id}/metrics", params={"name": "loss"}).json()["items"][0]
    assert (first["rank"], first["epoch"], first["value"]) == (0, 1, "NaN"), "kept as data"
    _assert_stopped(live_server, job)
    with live_server.client() as c:  # the job's resources are free again (the server is shared)
        held = [i for i in c.get("/resources").json()["items"] if i["job_id"] == job_id]
    assert held == []


def test_script_nan_loss_stops_the_job_and_every_view_says_why(
    server: LiveServer, tmp_path: Path
) -> None:
    """A script's ``worker.report(loss=nan)`` on rank 1 at epoch 3; shown by the CLI's
    ``submit --follow`` (the event stream) and ``show``."""
    spec = tmp_path / "nan.yaml"
    losses = ",".join(["1.0", "0.9", "nan"] + ["0.5"] * (LONG - 3))
    spec.write_text(
        f"entrypoint: losses.py\nnproc_per_node: 2\nargs: ['1.0;{losses}', '0.2']\n"
    )
    env = {"TORCHYARD_TOKEN": server.token or ""}
    run = cli(server, "submit", str(spec), "--follow", env=env)
    reason = "rank 1 reported loss NaN at epoch 3"
    assert run.returncode == 1, run.stdout + run.stderr  # EXIT_FAILED
    assert f"failed: {reason}" in run.stdout, run.stdout
    with server.client() as c:  # the newest: the jobs of this worker's tests run one by one
        job = c.get("/jobs", params={"limit": 1}).json()["items"][0]
        events = c.get(f"/jobs/{job['id']}/events").text
    assert job["state"] == "failed" and job["reason"] == reason
    last_state = [line for line in events.splitlines() if line.startswith("data:")][-1]
    assert '"state":"failed"' in last_state and reason in last_state
    shown = cli(server, "show", str(job["id"]), env=env)
    assert shown.returncode == 0 and reason in shown.stdout
    _assert_stopped(server, job)


def test_nonfinite_patience_counts_epochs_in_a_row_and_null_turns_it_off(
    server: LiveServer,
) -> None:
    with server.client() as c:
        patient = _script_job(
            c, _losses("1,nan,1,inf,nan," + ",".join(["1"] * (LONG - 5))) + ["0.1"],
            nonfinite_patience=2,
        )
        off = _script_job(c, _losses("nan,nan,nan"), nonfinite_patience=None)
    job = server.wait_for(patient, {"failed"}, timeout_s=120)
    assert job["reason"] == (
        "rank 0 reported loss NaN at epoch 5 (non-finite 2 epochs in a row)"
    ), job
    _assert_stopped(server, job)
    assert server.wait_for(off, {"succeeded"}, timeout_s=120)["reason"] is None


def test_divergence_patience_stops_a_rank_that_keeps_diverging(server: LiveServer) -> None:
    r0 = ",".join(["1.0"] * LONG)
    r1 = "1.0,1.1,9,1.0,9,9," + ",".join(["9"] * (LONG - 6))  # flagged at 3, then 5 and 6
    with server.client() as c:
        job_id = _script_job(c, _losses(r0, r1) + ["0.2"], nproc_per_node=2,
                             divergence_patience=2)
        quiet = _script_job(c, _losses("1,1", "1,9"), nproc_per_node=2)  # guard off by default
    job = server.wait_for(job_id, {"failed"}, timeout_s=120)
    assert job["reason"].startswith(
        "rank 1 diverged from the other ranks' loss 2 epochs in a row (epoch 6: 9; ranks: "
    ), job
    _assert_stopped(server, job)
    assert server.wait_for(quiet, {"succeeded"}, timeout_s=120)["state"] == "succeeded"
