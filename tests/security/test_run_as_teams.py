"""Jobs run as their team's Unix user, end to end through the API (issue 46, item 6): two teams
mapped to two Unix users on a real root server. Team A's 2-rank job runs as A's user, holds a
secret and keeps running; team B's job, run as B's user, reads none of A's run directory,
outputs or ranks' environments; A's member still downloads A's outputs through the API.

The mechanism below the launch (warm and cold ranks, ownership, confined reads) is tested at the
executor level in ``test_run_as.py``; this file checks that a team's ``unix_user`` reaches it.
"""

import io
import json
import tarfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import LiveServer
from tests.security.people import new_token
from tests.unixusers import python_for_users, reachable, users_or_skip
from torchyard_contract.launch import RunAs

BOOTSTRAP = "run-as-teams-bootstrap"
SECRET = "the-secret-of-team-a"
# Team A's ranks: say who they run as (into the outputs), then keep running until cancelled.
TRAIN_A = """\
import json, os, time
out, rank = os.environ["TORCHYARD_OUTPUT_DIR"], os.environ["RANK"]
info = {"uid": os.getuid(), "gid": os.getgid(), "groups": os.getgroups(), "pid": os.getpid(),
        "secret": os.environ.get("MY_SECRET") == EXPECTED}
with open(os.path.join(out, f".ids-{rank}"), "w") as f:
    json.dump(info, f)
os.replace(os.path.join(out, f".ids-{rank}"), os.path.join(out, f"ids-{rank}.json"))
time.sleep(600)
""".replace("EXPECTED", repr(SECRET))
# Team B's rank: try to read each path it is given; write what happened into its outputs.
TRAIN_B = """\
import json, os, sys
seen = {}
for label, path in json.loads(sys.argv[1]).items():
    try:
        seen[label] = os.listdir(path) if os.path.isdir(path) else open(path, "rb").read(64).hex()
    except OSError as exc:
        seen[label] = type(exc).__name__
with open(os.path.join(os.environ["TORCHYARD_OUTPUT_DIR"], "seen.json"), "w") as f:
    json.dump({"uid": os.getuid(), "seen": seen}, f)
"""


@pytest.fixture(scope="module")
def users() -> Iterator[tuple[RunAs, RunAs]]:
    with users_or_skip("ta", "tb") as (a, b):
        yield a, b


def _package(train: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        info = tarfile.TarInfo("train.py")
        info.size = len(train.encode())
        tar.addfile(info, io.BytesIO(train.encode()))
    return buf.getvalue()


def _client(server: LiveServer, token: str) -> httpx.Client:
    client = server.client()
    client.headers["Authorization"] = f"Bearer {token}"
    return client


def _upload(client: httpx.Client, body: bytes) -> str:
    r = client.post("/packages", content=body, headers={"Content-Type": "application/octet-stream"})
    assert r.status_code in (200, 201), r.text
    return r.json()["digest"]


def _artifact(client: httpx.Client, job_id: int, name: str, server: LiveServer) -> dict:
    """An output of a running job, once its rank wrote it (the job must not end meanwhile)."""
    deadline = time.monotonic() + 180
    while True:
        r = client.get(f"/jobs/{job_id}/artifacts/{name}")
        if r.status_code == 200:
            return json.loads(r.content)
        job = client.get(f"/jobs/{job_id}").json()
        assert job["state"] in ("queued", "starting", "running"), job["reason"]
        assert time.monotonic() < deadline, (job, server.log.read_text()[-3000:])
        time.sleep(0.3)


def test_a_teams_jobs_run_as_its_unix_user_and_another_team_reads_none_of_them(
    users: tuple[RunAs, RunAs], live_server_factory: Callable[..., LiveServer],
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory,
) -> None:
    a, b = users
    python = python_for_users(tmp_path_factory.mktemp("python"), a)
    reachable(tmp_path)  # a run-as job's run directory sits below; its users must pass through
    secrets = tmp_path / "secrets.json"
    secrets.write_text(json.dumps({"s": SECRET}))
    server = live_server_factory(
        TORCHYARD_API_TOKENS=BOOTSTRAP, TORCHYARD_PYTHON_EXECUTABLE=str(python),
        TORCHYARD_SECRETS_FILE=str(secrets), TORCHYARD_CPU_SLOTS="3",
        TORCHYARD_STACK_SAMPLER="off")
    with _client(server, BOOTSTRAP) as boot:
        for team, user in (("a", a), ("b", b)):
            r = boot.post("/teams", json={"name": team, "unix_user": user.user})
            assert r.status_code == 201, r.text
            assert boot.post("/users", json={"name": f"m{team}", "team": team,
                                             "role": "member"}).status_code == 201
        token_a, token_b = new_token(boot, "ma"), new_token(boot, "mb")
    with _client(server, token_a) as ca, _client(server, token_b) as cb:
        r = ca.post("/jobs", json={
            "name": "a", "entrypoint": "train.py", "package": _upload(ca, _package(TRAIN_A)),
            "nproc_per_node": 2, "secret_env": {"MY_SECRET": "s"}, "max_runtime_s": 900})
        assert r.status_code == 201, r.text
        job_a = r.json()["id"]
        ids = [_artifact(ca, job_a, f"ids-{rank}.json", server) for rank in (0, 1)]
        for rank in ids:  # every rank is A's user, in A's group only, and holds the secret
            assert (rank["uid"], rank["gid"], rank["groups"], rank["secret"]) == (
                a.uid, a.gid, [], True), rank
        run_a = server.home / "runs" / str(job_a)
        assert run_a.stat().st_uid == a.uid and run_a.stat().st_mode & 0o777 == 0o700
        assert cb.get(f"/jobs/{job_a}").status_code == 404  # another team's job: as if none

        paths = {"run": str(run_a), "outputs": str(run_a / "outputs"),
                 "ids": str(run_a / "outputs" / "ids-0.json"),
                 "environ": f"/proc/{ids[0]['pid']}/environ"}
        r = cb.post("/jobs", json={
            "name": "b", "entrypoint": "train.py", "package": _upload(cb, _package(TRAIN_B)),
            "nproc_per_node": 1, "args": [json.dumps(paths)]})
        assert r.status_code == 201, r.text
        job_b = r.json()["id"]
        done = server.wait_for(job_b, {"succeeded", "failed", "cancelled"}, timeout_s=180)
        assert done["state"] == "succeeded", done
        seen = json.loads(cb.get(f"/jobs/{job_b}/artifacts/seen.json").content)
        assert seen["uid"] == b.uid
        assert seen["seen"] == {label: "PermissionError" for label in paths}, seen

        # A's job kept running through all of it; its member cancels it.
        assert ca.get(f"/jobs/{job_a}").json()["state"] in ("starting", "running")  # not ended
        assert ca.post(f"/jobs/{job_a}/cancel").json()["state"] == "cancelled"
