"""Clean-up (issue 24, item 5): DELETE /jobs/{id}, retention, unused packages, the disk floor.

A deleted job leaves no row in any table, no record, no file (checked on both stores); a live
job is 409; deleting again is 404. Retention deletes old terminal jobs in the background. Below
the free-space floor new jobs and uploads get 507, and /healthz and Prometheus say how much is
free. A job's tree of any depth never breaks a delete or a clean-up pass, and one tree that
cannot be removed never keeps a pass from the others (issue 44, item 3).
"""

import logging
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Connection, create_engine, text

from service.app import create_app
from service.domain.files.cleanup import RECORD_BATCH, Cleanup, JobLive, JobNotFound
from service.domain.files.packages import PackageStore
from service.domain.files.unpack import Limits
from service.settings import Settings
from service.store import records as recordstore
from service.store import repository as repo
from service.store.db import make_engine, make_session_factory, upgrade
from service.store.records import RecordIn
from service.store.tables import Base
from tests.conftest import LiveServer, add_script, both_stores
from torchyard_contract.spec import JobSpec
from torchyard_contract.state import JobState
from torchyard_contract.treeremoval import remove_tree

JOB = {"dataset": "synthetic", "epochs": 1, "synthetic_samples": 64, "labels": {"t": "del"}}

# Deeper than Python's recursion limit (1,000): shutil.rmtree raised RecursionError on it.
DEPTH = 1200
DEEP_OUTPUTS = f"""\
import os
os.chdir(os.environ["TORCHYARD_OUTPUT_DIR"])
for _ in range({DEPTH}):
    os.mkdir("d")
    os.chdir("d")
with open("leaf.txt", "w") as f:
    f.write("deep")
"""


def _deep_tree(top: Path, depth: int = DEPTH) -> None:
    """``top/d/d/…/leaf.txt``, ``depth`` folders deep (made relative: no path grows long)."""
    top.mkdir(parents=True)
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir("d", dir_fd=fd)
            below = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = below
        os.close(os.open("leaf.txt", os.O_WRONLY | os.O_CREAT, dir_fd=fd))
    finally:
        os.close(fd)


def _aged(path: Path) -> Path:
    old = time.time() - 3600
    os.utime(path, (old, old), follow_symlinks=False)
    return path


# The slot usage account outlives the jobs it counts (docs/scheduling.md, "Accounting"): who
# used what stays true after a job is deleted.
OUTLIVES_THE_JOB = {"slot_usage"}


def _counts(conn: Connection, job_id: int) -> dict[str, int]:
    """Rows that mention the job in every table that has a job id, but the usage account."""
    counts = {}
    for table in Base.metadata.sorted_tables:
        column = "id" if table.name == "jobs" else "job_id"
        if column in table.c and table.name not in OUTLIVES_THE_JOB:
            counts[table.name] = conn.execute(
                text(f"SELECT count(*) FROM {table.name} WHERE {column} = :j"), {"j": job_id}
            ).scalar_one()
    return counts


def _rows_of(server: LiveServer, database_url: str | None, job_id: int) -> dict[str, int]:
    url = database_url or f"sqlite:///{server.home / 'torchyard.db'}"
    engine = create_engine(url)
    with engine.connect() as conn:
        counts = _counts(conn, job_id)
    engine.dispose()
    return counts


def test_delete_removes_everything(shared_server: LiveServer) -> None:
    """The live path, on the shared server (SQLite); the same statements on both stores are
    ``test_deleting_a_terminal_job_empties_every_table_it_owns``."""
    server = shared_server
    with server.client() as c:
        job_id = c.post("/jobs", json=JOB).json()["id"]
        live = c.delete(f"/jobs/{job_id}")
        assert live.status_code == 409 and "cancel it first" in live.json()["message"], live.text
        server.wait_for(job_id, {"succeeded"})
        run = server.home / "runs" / str(job_id)
        assert (run / "logs").is_dir() and (run / "outputs").is_dir()
        rows = _rows_of(server, None, job_id)
        assert rows["jobs"] == 1 and rows["metric_records"] > 0 and rows["job_labels"] == 1
        r = c.delete(f"/jobs/{job_id}")
        assert r.status_code == 204 and r.content == b""
        assert c.delete(f"/jobs/{job_id}").status_code == 404
        assert c.get(f"/jobs/{job_id}").status_code == 404
        assert c.get(f"/jobs/{job_id}/metrics").status_code == 404
        labelled = c.get("/jobs", params={"label": "t=del"}).json()["items"]
        assert job_id not in [j["id"] for j in labelled]
    assert set(_rows_of(server, None, job_id).values()) == {0}
    with server.client() as c:  # the account still has the job's slot-seconds
        usage = c.get("/usage", params={"group_by": "job"}).json()
    assert job_id in [row["job_id"] for row in usage["items"]], usage
    assert not run.exists()
    assert not [p for p in (server.home / "runs").iterdir() if str(job_id) in p.name]


@both_stores
def test_deleting_a_terminal_job_empties_every_table_it_owns(
    tmp_path: Path, database_url: str | None
) -> None:
    """``Cleanup.delete`` as each store runs it: the records in batches (a ``LIMIT`` inside
    ``IN``), then every job-owned row; a queued job is refused, another job keeps its rows."""
    url = database_url or f"sqlite:///{tmp_path / 'store.db'}"
    upgrade(url)
    engine = make_engine(url)
    sessions = make_session_factory(engine)
    cleanup = Cleanup(Settings(home=tmp_path / "home", cpu_slots=2, gpus="none"), sessions)
    spec = JobSpec.model_validate(JOB)
    with sessions() as s:
        doomed, kept = repo.create_job(s, spec).id, repo.create_job(s, spec).id
        s.commit()
    with pytest.raises(JobLive, match="cancel it first"):
        cleanup.delete(doomed)
    records = [RecordIn(1, 0, e, None, "loss", 0.5, 1.0) for e in range(RECORD_BATCH + 3)]
    with sessions() as s:
        for job_id in (doomed, kept):
            assert recordstore.insert_records(s, job_id, records) == len(records)
            assert repo.transition(s, job_id, JobState.starting)
            repo.allocate(s, job_id, [f"cpu:{job_id}"])
            assert repo.transition(s, job_id, JobState.failed, reason="test")
        s.commit()
    cleanup.delete(doomed)
    with pytest.raises(JobNotFound):
        cleanup.delete(doomed)
    with engine.connect() as conn:
        counts = {j: _counts(conn, j) for j in (doomed, kept)}
    engine.dispose()
    assert set(counts[doomed].values()) == {0}, counts[doomed]
    assert counts[kept]["jobs"] == 1 and counts[kept]["job_labels"] == 1
    assert counts[kept]["metric_records"] == len(records) and counts[kept]["allocations"] == 1


def test_delete_unknown_job_is_404(api: TestClient) -> None:
    r = api.delete("/jobs/12345")
    assert r.status_code == 404 and "12345" in r.json()["message"]


def test_retention_deletes_old_terminal_jobs(
    live_server_factory: Callable[..., LiveServer], database_url: str | None
) -> None:
    server = live_server_factory(
        TORCHYARD_RETENTION_DAYS=str(2 / 86400), TORCHYARD_RETENTION_SWEEP_S="0.2"
    )
    with server.client() as c:
        job_id = c.post("/jobs", json=JOB).json()["id"]
        server.wait_for(job_id, {"succeeded"})
        deadline = time.monotonic() + 30
        while c.get(f"/jobs/{job_id}").status_code != 404:
            assert time.monotonic() < deadline, "retention did not delete the job"
            time.sleep(0.2)
    assert set(_rows_of(server, database_url, job_id).values()) == {0}
    assert not (server.home / "runs" / str(job_id)).exists()


def test_unused_packages_are_collected_after_the_grace(tmp_path: Path) -> None:
    store = PackageStore(tmp_path / "packages", Limits(max_files=10, max_unpacked_bytes=10**6))
    base = store.root / "sha256"
    for name in ("a" * 64, "b" * 64, "c" * 64):
        (base / name / "tree").mkdir(parents=True)
        (base / name / "meta.json").write_text("{}")
    old = time.time() - 1000
    for name in ("a" * 64, "b" * 64):
        os.utime(base / name / "meta.json", (old, old))
    removed = store.collect(grace_s=500, in_use={"sha256:" + "b" * 64})
    assert removed == ["sha256:" + "a" * 64]  # b is named by a waiting job; c is recent
    assert sorted(p.name for p in base.iterdir()) == ["b" * 64, "c" * 64]


def test_disk_floor_refuses_new_work_with_507(tmp_path: Path) -> None:
    token = "delete-tests-api-token-0123456789"
    settings = Settings(home=tmp_path / "home", cpu_slots=2, gpus="none",
                        api_tokens=[token], disk_free_floor_bytes=1024**5)  # 1 PiB: never free
    with TestClient(create_app(settings, run_supervisor=False), raise_server_exceptions=False,
                    headers={"Authorization": f"Bearer {token}"}) as c:
        r = c.post("/jobs", json=JOB)
        assert r.status_code == 507 and "DISK_FREE_FLOOR" in r.json()["message"], r.text
        r = c.post("/packages", content=b"PK\x05\x06" + b"\0" * 18)
        assert r.status_code == 507 and "running jobs carry on" in r.json()["message"]
        health = c.get("/healthz").json()
        assert health["disk_low"] is True and health["disk_free_bytes"] > 0
        metrics = c.get("/metrics").text
        assert "torchyard_disk_free_bytes " in metrics


def test_a_deep_tree_never_breaks_delete(shared_script_server: LiveServer) -> None:
    """A real job leaves 1,200 nested folders in its outputs: they are listed, and
    ``DELETE`` answers 204 with the job and its whole run directory gone (it answered 500 after
    the rows were gone, and left the directory)."""
    server = shared_script_server
    add_script(server, "deep_outputs.py", DEEP_OUTPUTS)
    with server.client() as c:
        job_id = c.post("/jobs", json={"entrypoint": "deep_outputs.py"}).json()["id"]
        try:
            server.wait_for(job_id, {"succeeded"})
            page = c.get(f"/jobs/{job_id}/artifacts").json()
            assert [i["path"] for i in page["items"]] == ["d/" * DEPTH + "leaf.txt"]
            r = c.delete(f"/jobs/{job_id}")
            assert r.status_code == 204, r.text
            assert c.get(f"/jobs/{job_id}").status_code == 404
            assert c.delete(f"/jobs/{job_id}").status_code == 404
            left = _left_of(server, job_id)
            assert left == []
        finally:  # a deep tree left in the base temp would break pytest's own clean-up
            for path in _left_of(server, job_id):
                remove_tree(path)


def _left_of(server: LiveServer, job_id: int) -> list[Path]:
    return [p for p in (server.home / "runs").iterdir()
            if p.name == str(job_id) or p.name.startswith(f".deleting-{job_id}-")]


def test_a_clean_up_pass_removes_deep_trees(tmp_path: Path) -> None:
    """One pass (``Cleanup.sweep``, as the supervisor runs it) removes a deep renamed-aside
    directory, a deep run directory of a deleted job and a deep unused package, and the orphans
    beside them (the pass raised RecursionError at the first deep tree, on every pass)."""
    url = f"sqlite:///{tmp_path / 'store.db'}"
    upgrade(url)
    engine = make_engine(url)
    settings = Settings(home=tmp_path / "home", cpu_slots=2, gpus="none", package_grace_s=60)
    runs, packages = settings.runs_dir, settings.packages_dir / "sha256"
    trees = [runs / ".deleting-900001-0123abcd", runs / "900002", packages / ("a" * 64)]
    for top in trees:
        _deep_tree(top)
    (packages / ("a" * 64) / "meta.json").write_text("{}")
    _aged(packages / ("a" * 64) / "meta.json")
    plain = runs / "900003"
    (plain / "outputs").mkdir(parents=True)
    for top in [*trees, plain]:
        _aged(top)
    try:
        Cleanup(settings, make_session_factory(engine)).sweep()
        assert sorted(runs.iterdir()) == [] and sorted(packages.iterdir()) == []
    finally:  # a deep tree left in the base temp would break pytest's own clean-up
        engine.dispose()
        for top in trees:
            remove_tree(top)


def _unremovable(tree: Path) -> Callable[[], None]:
    """Make ``tree`` one the server's user cannot remove; returns the undo. Root removes
    anything but an immutable file (``chattr +i``); another user, nothing in a folder it may
    not write."""
    stuck = tree / "stuck"
    stuck.mkdir(parents=True)
    (stuck / "file").write_text("x")
    if os.geteuid() != 0:
        stuck.chmod(0o500)
        return lambda: stuck.chmod(0o700)
    done = subprocess.run(["chattr", "+i", str(stuck / "file")], capture_output=True, text=True,
                          check=False)
    if done.returncode != 0:
        pytest.skip(f"root cannot make an unremovable file here (chattr: {done.stderr.strip()})")
    return lambda: subprocess.run(["chattr", "-i", str(stuck / "file")], check=True)


def test_a_tree_that_cannot_be_removed_never_stops_the_pass(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A run directory of a deleted job that cannot be removed is logged and left for the next
    pass; every other orphan of the pass is removed."""
    url = f"sqlite:///{tmp_path / 'store.db'}"
    upgrade(url)
    engine = make_engine(url)
    settings = Settings(home=tmp_path / "home", cpu_slots=2, gpus="none")
    runs = settings.runs_dir
    undo = _unremovable(runs / "900010")
    try:
        for name in ("900009", "900011", ".deleting-900012-0123abcd"):
            (runs / name / "outputs").mkdir(parents=True)
        for top in runs.iterdir():
            _aged(top)
        with caplog.at_level(logging.WARNING, logger="service.domain.files.cleanup"):
            Cleanup(settings, make_session_factory(engine)).sweep()
        assert [p.name for p in runs.iterdir()] == ["900010"]
        assert any("900010" in r.getMessage() and "next pass" in r.getMessage()
                   for r in caplog.records), caplog.text
    finally:
        undo()
        engine.dispose()


def test_remove_tree_follows_no_symlink_and_takes_a_missing_path(tmp_path: Path) -> None:
    """``remove_tree``'s contract: symlinks (to a folder, to a file, at the top) are removed,
    never followed; names that are not UTF-8 go too; a missing path is not an error."""
    outside = tmp_path / "outside"
    (outside / "keep").mkdir(parents=True)
    (outside / "keep" / "file").write_text("keep me")
    tree = tmp_path / "tree"
    (tree / "a" / "b").mkdir(parents=True)
    (tree / "a" / "to-folder").symlink_to(outside, target_is_directory=True)
    (tree / "a" / "b" / "to-file").symlink_to(outside / "keep" / "file")
    (tree / "a" / "b" / "plain").write_text("x")
    os.close(os.open(os.fsencode(tree / "a") + b"/bad-\xff", os.O_WRONLY | os.O_CREAT))
    os.mkfifo(tree / "fifo")
    top_link = tmp_path / "top-link"
    top_link.symlink_to(outside, target_is_directory=True)
    remove_tree(tree)
    remove_tree(top_link)
    remove_tree(tmp_path / "never-was")
    assert not tree.exists() and not top_link.is_symlink()
    assert (outside / "keep" / "file").read_text() == "keep me"
