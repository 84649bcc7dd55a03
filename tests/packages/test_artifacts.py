"""Artifacts (issue 24, item 3): every job gets TORCHYARD_OUTPUT_DIR; the built-in trainer keeps
its final model there; files are listed with a cursor and downloaded with ETag, Range and
Content-Disposition. What a job wrote is hostile: symlinks, FIFOs, '..' never serve anything
outside that job's output; nor do hard links or another user's files, and a name that is not
UTF-8 is listed escaped (issue 44, items 13 and 14). A page costs what it returns, not what the
job kept (item 7); several ranges answer the whole file (item 15).
"""

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest

from service.domain.files.artifactlisting import LIST_MAX_EXAMINED, list_artifacts
from tests.conftest import LiveServer, add_script
from torchyard_contract.rundir import RunDir

JOB = {"dataset": "synthetic", "epochs": 2, "synthetic_samples": 64}


@pytest.fixture(scope="module")
def server(_shared_server: LiveServer) -> LiveServer:
    """The session's shared server (``tests/conftest.py``): the tests read their own job only."""
    return _shared_server


@pytest.fixture(scope="module")
def job(server: LiveServer) -> dict:
    with server.client() as c:
        job_id = c.post("/jobs", json=JOB).json()["id"]
    return server.wait_for(job_id, {"succeeded"})


@pytest.fixture
def client(server: LiveServer) -> Iterator[httpx.Client]:
    with server.client() as c:
        yield c


def outputs(server: LiveServer, job: dict) -> Path:
    return server.home / "runs" / str(job["id"]) / "outputs"


def test_trainer_keeps_its_model_and_checkpoints_are_listed(
    client: httpx.Client, job: dict
) -> None:
    page = client.get(f"/jobs/{job['id']}/artifacts").json()
    paths = [i["path"] for i in page["items"]]
    assert "model.pt" in paths, paths
    assert any(p.startswith("checkpoints/") for p in paths), paths
    assert paths == sorted(paths) and page["next_after"] is None
    model = next(i for i in page["items"] if i["path"] == "model.pt")
    assert model["size"] > 0 and model["modified"] > 0


def test_listing_pages_with_a_cursor(client: httpx.Client, server: LiveServer, job: dict) -> None:
    out = outputs(server, job)
    (out / "many").mkdir(exist_ok=True)
    for i in range(5):
        (out / "many" / f"f{i}.txt").write_text(str(i))
    seen, after = [], None
    while True:
        params = {"limit": 2, **({"after": after} if after else {})}
        page = client.get(f"/jobs/{job['id']}/artifacts", params=params).json()
        seen += [i["path"] for i in page["items"]]
        after = page["next_after"]
        if after is None:
            break
    assert seen == sorted(seen) and len(seen) == len(set(seen))
    assert [f"many/f{i}.txt" for i in range(5)] == [p for p in seen if p.startswith("many/")]


def test_download_with_etag_range_and_disposition(
    client: httpx.Client, server: LiveServer, job: dict
) -> None:
    data = os.urandom(300_000)
    (outputs(server, job) / "blob file é.bin").write_bytes(data)
    url = f"/jobs/{job['id']}/artifacts/blob file é.bin"
    full = client.get(url)
    assert full.status_code == 200 and full.content == data
    assert full.headers["content-length"] == str(len(data))
    assert full.headers["accept-ranges"] == "bytes"
    disposition = full.headers["content-disposition"]
    assert disposition.startswith("attachment;") and "filename*=UTF-8''blob%20file%20%C3%A9.bin" \
        in disposition
    etag = full.headers["etag"]
    assert client.get(url, headers={"If-None-Match": etag}).status_code == 304
    part = client.get(url, headers={"Range": "bytes=1000-1999"})
    assert part.status_code == 206 and part.content == data[1000:2000]
    assert part.headers["content-range"] == f"bytes 1000-1999/{len(data)}"
    # A resumed download: the rest from an offset, checked with If-Range.
    rest = client.get(url, headers={"Range": "bytes=250000-", "If-Range": etag})
    assert rest.status_code == 206 and rest.content == data[250000:]
    assert client.get(url, headers={"Range": "bytes=-10"}).content == data[-10:]
    stale = client.get(url, headers={"Range": "bytes=0-9", "If-Range": '"old"'})
    assert stale.status_code == 200 and stale.content == data
    # Several ranges: the whole file (RFC 9110 lets a server ignore Range), never 416.
    several = client.get(url, headers={"Range": "bytes=0-1,5-6"})
    assert several.status_code == 200 and several.content == data
    assert "content-range" not in several.headers
    bad = client.get(url, headers={"Range": f"bytes={len(data)}-"})
    assert bad.status_code == 416 and bad.headers["content-range"] == f"bytes */{len(data)}"
    head = client.head(url)
    assert head.status_code == 200 and head.content == b"" and head.headers["etag"] == etag
    model = client.get(f"/jobs/{job['id']}/artifacts/model.pt")
    run = server.home / "runs" / str(job["id"])
    assert hashlib.sha256(model.content).digest() == hashlib.sha256(
        (run / "outputs" / "model.pt").read_bytes()).digest()


def test_hostile_outputs_never_serve_outside(
    client: httpx.Client, server: LiveServer, job: dict, tmp_path: Path
) -> None:
    out = outputs(server, job)
    secret = tmp_path / "server-secret.txt"
    secret.write_text("do not serve me")
    (out / "link-to-secret").symlink_to(secret)
    (out / "link-to-db").symlink_to(server.home / "torchyard.db")
    (out / "linked-dir").symlink_to(tmp_path, target_is_directory=True)
    os.mkfifo(out / "fifo")
    ckpt = server.home / "runs" / str(job["id"]) / "checkpoints"
    (ckpt / "evil.pt").symlink_to(secret)
    listed = [i["path"] for i in client.get(f"/jobs/{job['id']}/artifacts",
                                            params={"limit": 1000}).json()["items"]]
    for name in ("link-to-secret", "link-to-db", "fifo", "checkpoints/evil.pt"):
        assert name not in listed
    assert not any(p.startswith("linked-dir") for p in listed)
    for path in (
        "link-to-secret", "link-to-db", "fifo", "linked-dir/server-secret.txt",
        "checkpoints/evil.pt", "../spec.json", "many/../../spec.json", "%2e%2e/spec.json",
        "many/%2e%2e/%2e%2e/spec.json", "many//f1.txt",
    ):
        r = client.get(f"/jobs/{job['id']}/artifacts/{path}")
        assert r.status_code == 404, (path, r.status_code, r.content[:100])
        assert b"do not serve me" not in r.content and b"SQLite" not in r.content
    # Another job's outputs are not reachable from this one.
    other = client.get(f"/jobs/{job['id']}/artifacts/..%2F..%2F{job['id']}%2Foutputs%2Fmodel.pt")
    assert other.status_code == 404
    assert client.get("/jobs/999999/artifacts").status_code == 404


# --- what a page costs (item 7) -----------------------------------------------------------------

WIDE_DIRS, WIDE_FILES = 100, 100  # outputs/wide/dNNN/fNNNN: 10,000 files


def _wide(out: Path) -> list[str]:
    paths = []
    for d in range(WIDE_DIRS):
        folder = out / "wide" / f"d{d:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        for f in range(WIDE_FILES):
            (folder / f"f{f:04d}").touch()
            paths.append(f"wide/d{d:03d}/f{f:04d}")
    return paths


def test_a_page_costs_what_it_returns(client: httpx.Client, server: LiveServer, job: dict) -> None:
    """A page reads the folders that lead to its cursor and the entries it returns, not the
    job's 10,000 files (every page read and sorted them all); the whole listing, page by page,
    is every file once, in order."""
    out = outputs(server, job)
    wide = _wide(out)
    page = client.get(f"/jobs/{job['id']}/artifacts",
                      params={"after": "wide/d050/f0040", "limit": 10}).json()
    assert [i["path"] for i in page["items"]] == [f"wide/d050/f{f:04d}" for f in range(41, 51)]
    # The output directory's own entries, wide/'s folders, d050's files: nothing else.
    assert page["examined"] <= len(os.listdir(out)) + WIDE_DIRS + WIDE_FILES, page["examined"]
    assert page["next_after"] == "wide/d050/f0050"
    seen, after = [], "wide/"
    while after is not None and after.startswith("wide/"):
        page = client.get(f"/jobs/{job['id']}/artifacts",
                          params={"after": after, "limit": 1000}).json()
        seen += [i["path"] for i in page["items"] if i["path"].startswith("wide/")]
        # The cursor's way, this page's entries and at most one folder begun past the bound.
        bound = len(os.listdir(out)) + WIDE_DIRS + LIST_MAX_EXAMINED + 2 * WIDE_FILES
        assert page["examined"] <= bound, (after, page["examined"])
        after = page["next_after"]
    assert seen == wide


def test_a_page_stops_at_its_bound_and_the_cursor_goes_on(tmp_path: Path) -> None:
    """With a bound of 50 entries, a page stops early (fewer items than asked, a cursor), and
    the pages after it list every file once, in order, whatever the bound cut."""
    run = RunDir.for_job(tmp_path / "runs", 1)
    expected = []
    for d in range(10):
        (run.output_dir / f"d{d}").mkdir(parents=True)
        for f in range(20):
            (run.output_dir / f"d{d}" / f"f{f:02d}").touch()
            expected.append(f"d{d}/f{f:02d}")
    first = list_artifacts(run, None, 1000, os.geteuid(), max_examined=50)
    assert 0 < len(first.items) < 1000 and first.next_after == first.items[-1].path
    assert first.examined <= 10 + 50 + 20  # the top, the bound, one folder begun before it
    seen, after, pages = [], None, 0
    while True:
        page = list_artifacts(run, after, 1000, os.geteuid(), max_examined=50)
        seen += [i.path for i in page.items]
        pages += 1
        if page.next_after is None:
            break
        assert after is None or page.next_after > after
        after = page.next_after
    assert seen == expected and pages > 1


# --- what is never served (items 13, 14) --------------------------------------------------------

# A job that hard-links the server's SQLite file (and a file of its own, twice) into its outputs,
# makes a file of another user where it runs as root, and names files with bytes that are not
# UTF-8 and with '%'.
HOSTILE_OUTPUTS = """\
import os
from pathlib import Path

out = Path(os.environ["TORCHYARD_OUTPUT_DIR"])
home = out.parents[2]  # TORCHYARD_HOME/runs/<id>/outputs
os.link(home / "torchyard.db", out / "server.db")
(out / "own.txt").write_text("mine")
(out / "twice.txt").write_text("linked twice")
os.link(out / "twice.txt", out / "twice-again.txt")
if os.geteuid() == 0:
    (out / "foreign.txt").write_text("another user's")
    os.chown(out / "foreign.txt", 54321, 54321)
(out / "names").mkdir()
(out / "names" / "100%.txt").write_text("percent")
with open(os.fsencode(out / "names") + b"/bad-\\xff\\xfe.bin", "wb") as f:
    f.write(b"not utf-8")
"""


@pytest.fixture(scope="module")
def hostile_job(_shared_script_server: LiveServer) -> Iterator[tuple[LiveServer, int]]:
    server = _shared_script_server
    add_script(server, "hostile_outputs.py", HOSTILE_OUTPUTS)
    with server.client() as c:
        job_id = c.post("/jobs", json={"entrypoint": "hostile_outputs.py"}).json()["id"]
        server.wait_for(job_id, {"succeeded"})
        yield server, job_id
        assert c.delete(f"/jobs/{job_id}").status_code == 204  # the link to the database goes


def test_hard_links_and_other_users_files_are_not_served(
    hostile_job: tuple[LiveServer, int]
) -> None:
    """A hard link to the server's database (or to anything: one link only) and a file of
    another user are neither listed (they are counted as skipped) nor served."""
    server, job_id = hostile_job
    refused = ["server.db", "twice.txt", "twice-again.txt"]
    if os.geteuid() == 0:  # only root could make another user's file
        refused.append("foreign.txt")
    with server.client() as c:
        for path in refused:
            r = c.get(f"/jobs/{job_id}/artifacts/{path}")
            assert r.status_code == 404, (path, r.status_code, r.content[:40])
            assert b"SQLite format" not in r.content
        assert c.get(f"/jobs/{job_id}/artifacts/own.txt").content == b"mine"
        page = c.get(f"/jobs/{job_id}/artifacts", params={"limit": 1000}).json()
        listed = [i["path"] for i in page["items"]]
        assert "own.txt" in listed
        assert not set(refused) & set(listed), listed
        assert page["skipped"] >= len(refused)


def test_names_that_are_not_utf8_are_listed_escaped_and_download(
    hostile_job: tuple[LiveServer, int]
) -> None:
    """The listing answers (it was a 500): bytes that are not UTF-8 are written %XX and '%' as
    %25; the listed path, URL-quoted, downloads the file."""
    server, job_id = hostile_job
    with server.client() as c:
        r = c.get(f"/jobs/{job_id}/artifacts", params={"after": "names/", "limit": 10})
        assert r.status_code == 200, r.text
        listed = [i["path"] for i in r.json()["items"] if i["path"].startswith("names/")]
        assert listed == ["names/100%25.txt", "names/bad-%FF%FE.bin"]
        for path, content in zip(listed, (b"percent", b"not utf-8"), strict=True):
            got = c.get(f"/jobs/{job_id}/artifacts/{quote(path)}")
            assert got.status_code == 200 and got.content == content, (path, got.text)
        # What no file can be named is refused, encoded or not.
        for bad in ("names/%2F", "names/%00", "%2E%2E/spec.json", "names/%2E"):
            assert c.get(f"/jobs/{job_id}/artifacts/{quote(bad)}").status_code == 404, bad
