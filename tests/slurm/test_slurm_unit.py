"""The Slurm executor's pure parts: batch script, srun argv, sbatch environment, the
parsing of squeue / scontrol / sinfo / sacct output (captured from Slurm 22.05), and the
failing rank's global rank in a reason from a node's torchrun error files."""

import json
import os
from pathlib import Path

import pytest

from service.executor.base import RankLog
from service.executor.slurm import SlurmExecutor
from service.executor.slurmcli import (
    SlurmCli,
    parse_exit_code,
    parse_sacct,
    parse_scontrol_record,
    parse_sinfo,
    parse_squeue,
)
from service.executor.slurmpreflight import (
    PreflightError,
    all_nodes_here,
    check_public_url,
    check_shared_runs,
    mount_type,
)
from service.executor.slurmscript import (
    BatchRequest,
    build_batch_script,
    build_sbatch_command,
    job_environment,
    job_id_from_name,
    sbatch_environment,
    time_limit,
)
from service.run.exitreason import describe_exit
from service.run.srun import StepRequest, build_srun_command
from tools.openapi import checked_in_document
from torchyard_contract.launch import RunAs
from torchyard_contract.nodes import EXCLUDE_NODES_MAX, global_rank, rank_location
from torchyard_contract.rundir import RunDir

RUN = Path("/shared/torchyard/runs/12")


def test_batch_script_is_a_fixed_text_with_validated_options() -> None:
    script = build_batch_script(BatchRequest(
        job_id=12, run_dir=RUN, python="/opt/venv/bin/python", nnodes=2, nproc_per_node=2,
        max_runtime_s=3600, stop_grace_s=10, partition="gpu-a100", account="ml_team",
    ))
    lines = script.splitlines()
    assert lines[0] == "#!/bin/sh"
    assert "#SBATCH --job-name=ty-12" in lines
    assert "#SBATCH --nodes=2" in lines
    assert "#SBATCH --ntasks-per-node=1" in lines
    assert "#SBATCH --cpus-per-task=2" in lines
    assert "#SBATCH --time=0-01:02:00" in lines  # 3600 + 10 grace + 60 margin, in minutes up
    assert "#SBATCH --partition=gpu-a100" in lines and "#SBATCH --account=ml_team" in lines
    assert "#SBATCH --no-requeue" in lines
    assert lines[-1] == (
        "exec '/opt/venv/bin/python' '-m' 'service.run.attemptloop' '--launcher=slurm' "
        "'/shared/torchyard/runs/12'"
    )
    assert "TOKEN" not in script


def test_gpu_partition_asks_for_gpus_per_node() -> None:
    script = build_batch_script(BatchRequest(
        job_id=3, run_dir=RUN, python="python", nnodes=4, nproc_per_node=8, gpus_per_node=8,
    ))
    assert "#SBATCH --gpus-per-node=8" in script
    assert "--time" not in script  # no max_runtime_s: the partition's limit


@pytest.mark.parametrize(
    ("field", "value"),
    [("partition", "gpu --wrap=rm"), ("account", "a;b"), ("qos", "x\n#SBATCH --uid=0"),
     ("constraint", "a b"), ("partition", "")],
)
def test_no_free_form_sbatch_flags(field: str, value: str) -> None:
    with pytest.raises(ValueError, match=field):
        BatchRequest(job_id=1, run_dir=RUN, python="python", nnodes=1, nproc_per_node=1,
                     **{field: value})


def test_excluded_nodes_are_one_exclude_line_of_validated_names() -> None:
    """retry_elsewhere (docs/lifecycle.md): the nodes a job failed on, never free-form text."""
    req = dict(job_id=1, run_dir=RUN, python="python", nnodes=1, nproc_per_node=1)
    script = build_batch_script(BatchRequest(**req, exclude=("n1", "gpu-07.cluster")))
    assert "#SBATCH --exclude=n1,gpu-07.cluster" in script.splitlines()
    assert "--exclude" not in build_batch_script(BatchRequest(**req))
    for bad in ("n[1-2]", "n1,n2", "n1 --uid=0", "n1\n#SBATCH --uid=0", "", "-n1", "n1;id"):
        with pytest.raises(ValueError, match="exclude"):
            BatchRequest(**req, exclude=(bad,))
    with pytest.raises(ValueError, match="at most"):
        BatchRequest(**req, exclude=tuple(f"n{i}" for i in range(EXCLUDE_NODES_MAX + 1)))


def test_time_limit_rounds_up_to_whole_minutes_and_days() -> None:
    assert time_limit(None, 10) is None
    assert time_limit(1, 0) == "0-00:02:00"
    assert time_limit(2 * 86400, 0) == "2-00:01:00"


def test_srun_starts_one_torchrun_per_node_with_static_rendezvous() -> None:
    argv = build_srun_command(StepRequest(
        python="/venv/bin/python", nnodes=2, nproc_per_node=3, master_addr="node-a",
        master_port=29511, logs_dir=RUN / "logs/attempt-1", program=("-m", "worker", "--spec", "s"),
    ))
    assert argv[:2] == ["srun", "--kill-on-bad-exit=1"]
    assert "--nodes=2" in argv and "--ntasks=2" in argv and "--cpus-per-task=3" in argv
    sh = argv.index("sh")
    wrapper = argv[sh + 2]
    assert '--node-rank="$SLURM_NODEID"' in wrapper and "29511" not in wrapper  # values are args
    assert argv[sh + 3:sh + 6] == ["sh", str(RUN / "logs/attempt-1"), "/venv/bin/python"]
    assert "--nnodes=2" in argv and "--master-addr=node-a" in argv
    assert "--master-port=29511" in argv
    assert argv[-4:] == ["-m", "worker", "--spec", "s"]


def test_sbatch_environment_keeps_nothing_of_the_server_but_the_basics() -> None:
    server = {"PATH": "/usr/bin", "SLURM_CONF": "/etc/s.conf", "TORCHYARD_API_TOKENS": "secret",
              "TORCHYARD_DATABASE_URL": "postgresql://u:p@db/x", "AWS_SECRET_ACCESS_KEY": "k"}
    env = sbatch_environment(server)
    # The job's own variables are never sbatch's: they travel in its --export-file.
    assert env == {"PATH": "/usr/bin", "SLURM_CONF": "/etc/s.conf"}


def test_a_job_of_a_teams_user_is_submitted_as_that_user() -> None:
    """``--uid``/``--gid`` (root only) and the user's login variables, not the server's; a job
    of the server's own user is submitted as before."""
    nobody = RunAs(user="nobody", uid=65534, gid=65534)
    argv = build_sbatch_command("/usr/bin/sbatch", Path("/r/job.sbatch"), 5, nobody)
    assert argv == ["/usr/bin/sbatch", "--parsable", "--export-file=5", "--uid=nobody",
                    "--gid=65534", "/r/job.sbatch"]
    assert "--uid" not in " ".join(build_sbatch_command("/usr/bin/sbatch", Path("/r/j"), 5))
    server = {"PATH": "/usr/bin", "HOME": "/root", "USER": "root", "LOGNAME": "root"}
    env = job_environment(server, {"TORCHYARD_JOB_ID": "1"}, nobody)
    assert (env["USER"], env["LOGNAME"], env["PATH"]) == ("nobody", "nobody", "/usr/bin")
    assert env["HOME"] != "/root" and env["TORCHYARD_JOB_ID"] == "1"
    assert job_environment(server, {}, None)["HOME"] == "/root"


def test_rank_location_is_node_major() -> None:
    assert [rank_location(r, 2) for r in range(4)] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert [global_rank(*rank_location(r, 2), 2) for r in range(4)] == [0, 1, 2, 3]
    assert job_id_from_name("ty-42") == 42 and job_id_from_name("other") is None


def _error_file(logs: Path, where: str, message: str, mtime_ns: int) -> None:
    """A rank's ``@record`` error file where torchrun puts it: ``<where>`` is the directories
    below the attempt's log dir down to the one named by the rank on its node."""
    path = logs / where / "error.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"message": {"message": message, "extraInfo": {
        "py_callstack": "Traceback ...", "timestamp": "1700000000"}}}))
    os.utime(path, ns=(mtime_ns, mtime_ns))


@pytest.mark.parametrize(("nproc", "node", "local", "rank"), [(1, 1, 0, 1), (2, 1, 1, 3)])
def test_a_failure_on_the_second_node_is_named_by_its_global_rank(
    tmp_path: Path, nproc: int, node: int, local: int, rank: int
) -> None:
    """Two nodes, one torchrun each (``service.run.srun``): each writes its ranks' error files
    under ``node-<k>/<run id>/attempt_0/<local rank>/``, named by the rank on the node."""
    logs = tmp_path / "attempt-1"
    t0 = 1_700_000_000 * 10**9
    _error_file(logs, f"node-{node}/none_k2j4/attempt_0/{local}",
                f"RuntimeError: rank {rank} failed", t0)
    # The other node's rank 0 fails after it (its peer is gone): the first one names the job's.
    _error_file(logs, "node-0/none_8x1q/attempt_0/0", "RuntimeError: Connection closed by peer",
                t0 + 5_000_000)
    (logs / "node-0.log").write_text("")
    assert describe_exit(1, logs, logs / "node-0.log", nproc) == (
        f"rank {rank} failed: RuntimeError: rank {rank} failed (torchrun exited with code 1)")


def test_a_failure_under_one_torchrun_is_named_by_its_rank(tmp_path: Path) -> None:
    logs = tmp_path / "attempt-1"  # the local executor's one torchrun: local rank = global rank
    _error_file(logs, "none_z0a1/attempt_0/1", "ValueError: bad batch", 1_700_000_000 * 10**9)
    assert describe_exit(1, logs, logs / "torchrun.log", 2).startswith(
        "rank 1 failed: ValueError: bad batch")


def test_parse_squeue_rows_and_noise() -> None:
    text = (
        "17|PENDING|Resources|n/a|\n"
        "18|RUNNING|None|n1|n[1-2]\n"
        "19|COMPLETED|None|n2|n2\n"
        "slurm_load_jobs error: something\n"
    )
    rows = parse_squeue(text)
    assert set(rows) == {"17", "18", "19"}
    assert rows["17"].pending and rows["17"].reason == "Resources" and rows["17"].batch_host is None
    assert not rows["18"].pending and not rows["18"].terminal and rows["18"].nodes == "n[1-2]"
    assert rows["19"].terminal


def test_parse_scontrol_values_with_spaces_and_equals() -> None:
    line = (
        "JobId=7 JobName=ty-7 UserId=root(0) JobState=FAILED Reason=NonZeroExitCode "
        "ExitCode=3:0 BatchHost=n1 Command=/runs/a b/job.sbatch TRES=cpu=2,mem=2M,node=2 "
        "Socks/Node=* NodeList=n[1-2]"
    )
    rec = parse_scontrol_record(line)
    assert rec["JobState"] == "FAILED" and rec["ExitCode"] == "3:0"
    assert rec["Command"] == "/runs/a b/job.sbatch"
    assert rec["TRES"] == "cpu=2,mem=2M,node=2" and rec["Socks/Node"] == "*"
    assert parse_exit_code(rec["ExitCode"]) == (3, 0) and parse_exit_code(None) is None


def test_parse_sinfo_and_sacct() -> None:
    nodes = parse_sinfo(
        "n1|vm|idle|0/2/0/2|(null)|debug*\n"
        "n2|vm|allocated*|2/0/0/2|gpu:a100:4(S:0-1),gpu:t4:2|debug*\nbad line\n"
    )
    assert [(n.name, n.hostname, n.state, n.cpus_allocated, n.cpus, n.gpus, n.partition)
            for n in nodes] == [("n1", "vm", "idle", 0, 2, 0, "debug"),
                                ("n2", "vm", "allocated", 2, 2, 6, "debug")]
    found = parse_sacct("5|COMPLETED|0:0\n6|CANCELLED by 0|0:15\n")
    assert found == {"5": ("COMPLETED", (0, 0)), "6": ("CANCELLED", (0, 15))}


# --- start-up checks (service.executor.slurmpreflight) ----------------------------------------

MOUNTS = """\
overlay / overlay rw 0 0
/dev/sda1 /srv ext4 rw 0 0
fs1:/export /srv/shared nfs4 rw 0 0
"""


def test_mount_type_is_the_longest_mount_prefix() -> None:
    assert mount_type(Path("/srv/shared/torchyard/runs"), MOUNTS) == "nfs4"
    assert mount_type(Path("/srv/sharedx/runs"), MOUNTS) == "ext4"
    assert mount_type(Path("/tmp/runs"), MOUNTS) == "overlay"


def test_run_directories_must_be_shared_unless_every_node_is_this_host() -> None:
    check_shared_runs(Path("/srv/shared/runs"), "nfs4", nodes_here=False,
                      operator_says_shared=False)
    check_shared_runs(Path("/tmp/runs"), "ext4", nodes_here=True, operator_says_shared=False)
    check_shared_runs(Path("/srv/runs"), "ext4", nodes_here=False, operator_says_shared=True)
    with pytest.raises(PreflightError, match="TORCHYARD_SLURM_SHARED_RUNS"):
        check_shared_runs(Path("/srv/runs"), "ext4", nodes_here=False,
                          operator_says_shared=False)


@pytest.mark.parametrize("url", ["http://127.0.0.1:8000", "http://localhost:8000",
                                 "http://0.0.0.0:8000", "http://[::1]:8000"])
def test_loopback_public_url_is_refused_when_nodes_are_elsewhere(url: str) -> None:
    with pytest.raises(PreflightError, match="TORCHYARD_PUBLIC_URL"):
        check_public_url(url, nodes_here=False)
    check_public_url(url, nodes_here=True)  # a one-host cluster reaches loopback


def test_reachable_public_url_passes_and_nonsense_is_refused() -> None:
    check_public_url("http://head.cluster.example:8000", nodes_here=False)
    with pytest.raises(PreflightError, match="not an http"):
        check_public_url("ftp://head:21", nodes_here=False)
    assert all_nodes_here(["vm", "vm"], {"vm"}) and not all_nodes_here(["vm", "n2"], {"vm"})
    assert not all_nodes_here([], {"vm"})


# --- what the local executor refuses (422 naming the field and why) ---------------------------


def test_local_executor_refuses_nnodes_and_slurm_fields(api) -> None:  # type: ignore[no-untyped-def]
    r = api.post("/jobs", json={"nnodes": 2})
    assert r.status_code == 422, r.text
    assert "nnodes" in r.text and "TORCHYARD_EXECUTOR=slurm" in r.text
    r = api.post("/jobs", json={"partition": "gpu"})
    assert r.status_code == 422 and "partition" in r.text and "slurm executor" in r.text
    r = api.post("/jobs", json={"partition": "gpu --uid=0"})
    assert r.status_code == 422 and "partition" in r.text
    assert api.post("/jobs", json={"nnodes": 0}).status_code == 422
    job = api.post("/jobs", json={"nnodes": 1}).json()
    assert "nnodes" not in job["spec"]  # defaults of the Slurm fields are not stored


def test_openapi_states_the_slurm_field_bounds(api) -> None:  # type: ignore[no-untyped-def]
    # The generic (checked-in) document; a local-executor server's own says nnodes ≤ 1.
    doc = json.loads(checked_in_document())
    spec = doc["paths"]["/jobs"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    spec = spec["properties"]
    assert spec["nnodes"]["minimum"] == 1 and spec["nnodes"]["maximum"] == 1024
    partition = next(s for s in spec["partition"]["anyOf"] if s.get("type") == "string")
    assert partition["pattern"].startswith("^[A-Za-z0-9_]")


def test_rank_log_maps_global_rank_to_node_and_refuses_symlinks_out(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "runs" / "7")
    run.prepare()
    run.launch_file.write_text(json.dumps({"nproc_per_node": 2}))
    for node, name in ((0, "n1"), (1, "n2")):
        node_dir = run.logs_dir / "attempt-1" / f"node-{node}"
        for local in (0, 1):
            log = node_dir / "none_abc" / "attempt_0" / str(local) / "stderr.log"
            log.parent.mkdir(parents=True)
            log.write_text(f"rank {node * 2 + local}\n")
        (node_dir / "node").write_text(f"{name}\n")
    executor = SlurmExecutor(SlurmCli(env={}), python="python", server_env={}, stop_grace_s=1)
    where = executor.rank_log(run, 1, 3, "stderr")
    assert where.node == "n2" and where.path is not None
    assert where.path.read_text() == "rank 3\n"
    assert executor.rank_log(run, 1, 0, "stderr").node == "n1"
    assert executor.rank_log(run, 2, 0, "stderr") == RankLog(rank=0, node=None, path=None)

    secret = tmp_path / "secret.txt"
    secret.write_text("not the job's")
    planted = run.logs_dir / "attempt-1" / "node-1" / "none_abc" / "attempt_0" / "1" / "stderr.log"
    planted.unlink()
    planted.symlink_to(secret)
    (run.logs_dir / "attempt-1" / "node-1" / "node").unlink()
    (run.logs_dir / "attempt-1" / "node-1" / "node").symlink_to(secret)
    assert executor.rank_log(run, 1, 3, "stderr") == RankLog(rank=3, node=None, path=None)


def test_the_teams_account_and_qos_are_used_where_the_spec_names_none(tmp_path: Path) -> None:
    """A team's ``slurm_account``/``slurm_qos`` travel with the submission (``Submission``);
    the spec's own win (an admin's choice; a member may name no other, 422 at submit), then
    the server's defaults (``TORCHYARD_SLURM_ACCOUNT``)."""
    from service.executor.base import Submission
    from service.executor.slurm import SlurmDefaults

    run = RunDir.for_job(tmp_path / "runs", 7)
    run.root.mkdir(parents=True)
    executor = SlurmExecutor(SlurmCli(env={}), python="python", server_env={}, stop_grace_s=1,
                             defaults=SlurmDefaults(account="default-acct"))

    def request(spec: dict, **team: str):  # type: ignore[no-untyped-def]
        run.spec_file.write_text(json.dumps({"device": "cpu", **spec}))
        return executor.batch_request(Submission(7, run, {}, 1, **team))

    teams = request({}, account="vision-acct", qos="high")
    assert (teams.account, teams.qos) == ("vision-acct", "high")
    assert "#SBATCH --account=vision-acct" in build_batch_script(teams).splitlines()
    assert "#SBATCH --qos=high" in build_batch_script(teams).splitlines()
    assert request({"account": "own"}, account="vision-acct").account == "own"
    assert (request({}).account, request({}).qos) == ("default-acct", None)
