"""Artifacts (issue 24, item 3): every job gets TORCHYARD_OUTPUT_DIR; the built-in trainer keeps
its final model there; files are listed with a cursor and downloaded with ETag, Range and
Content-Disposition. What a job wrote is hostile: symlinks, FIFOs, '..' never serve anything
outside that job's output.
"""

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import LiveServer

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
