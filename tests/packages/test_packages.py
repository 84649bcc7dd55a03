"""Packages (issue 24, items 1 and 2): code uploaded as a zip or tar.gz, stored once by digest,
unpacked safely, and run by a job in its own copy of it; the bounds on depth, names and the
compression ratio, and archive errors that are all 422 (issue 44, items 2, 12 and 15).

One real server per module (API tokens on, small limits); every archive is made here with the
standard library; every hostile case checks the 4xx and that nothing was written outside the
store (nor left in it).
"""

import hashlib
import io
import json
import random
import socket
import stat
import tarfile
import threading
import warnings
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.settings import Settings
from tests.conftest import LiveServer, _start_server, _stop_server
from tests.warm.warmjobs import wait_warm

TOKEN = "packages-tests-api-token-0123456789"
MAX_FILES = 40
MAX_UNPACKED = 4 * 1024 * 1024

TRAIN = '''\
import json
import os
import sys

from helper import VALUE  # a sibling module

with open("config.json") as f:  # a file relative to the package root
    config = json.load(f)
seen_scratch = os.path.exists("scratch.txt")
with open("scratch.txt", "w") as f:  # written in the job's own copy only
    f.write("written by a job")
result = {
    "value": VALUE, "config": config, "seen_scratch": seen_scratch, "cwd": os.getcwd(),
    "path0": sys.path[0], "args": sys.argv[1:],
}
with open(os.path.join(os.environ["TORCHYARD_OUTPUT_DIR"], "result.json"), "w") as f:
    json.dump(result, f)
'''


def make_zip(members: dict[str, bytes], *, mode: int | None = None) -> bytes:
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # duplicate names warn
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
            for name, data in members.items() if isinstance(members, dict) else members:
                info = zipfile.ZipInfo(name)
                info.compress_type = zipfile.ZIP_DEFLATED
                if mode is not None:
                    info.external_attr = mode << 16
                zf.writestr(info, data)
    return buf.getvalue()


def make_tar(add: Callable[[tarfile.TarFile], None]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", encoding="utf-8",
                      errors="surrogateescape", format=tarfile.PAX_FORMAT) as tar:
        add(tar)
    return buf.getvalue()


def tar_files(members: dict[str, bytes]) -> Callable[[tarfile.TarFile], None]:
    def add(tar: tarfile.TarFile) -> None:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return add


def tar_special(name: str, kind: bytes, linkname: str = "") -> Callable[[tarfile.TarFile], None]:
    def add(tar: tarfile.TarFile) -> None:
        tar_files({"ok.py": b"x = 1\n"})(tar)
        info = tarfile.TarInfo(name)
        info.type, info.linkname = kind, linkname
        tar.addfile(info)
    return add


PROJECT = {
    "train.py": TRAIN.encode(),
    "helper.py": b"VALUE = 42\n",
    "config.json": json.dumps({"lr": 0.5}).encode(),
    "pkg/__init__.py": b"",
    "pkg/main.py": b"import helper\nprint('module', helper.VALUE)\n",
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    home = tmp_path_factory.mktemp("pkg") / "home"
    live = _start_server(home, {
        "TORCHYARD_API_TOKENS": TOKEN,
        "TORCHYARD_PACKAGE_MAX_FILES": str(MAX_FILES),
        "TORCHYARD_PACKAGE_MAX_UNPACKED_BYTES": str(MAX_UNPACKED),
        "TORCHYARD_PACKAGE_MAX_UPLOAD_BYTES": str(8 * 1024 * 1024),
        # Warm ranks, the default (tests/conftest.py turns them off elsewhere): a package job's
        # working directory and sys.path must reach the warm process (test_ci_flow runs cold).
        "TORCHYARD_WARM_RANKS": "true",
    })
    yield live
    _stop_server(live)


@pytest.fixture
def client(server: LiveServer) -> Iterator[httpx.Client]:
    with server.client() as c:
        yield c


def digest_of(body: bytes) -> str:
    return "sha256:" + hashlib.sha256(body).hexdigest()


def store_entries(server: LiveServer) -> tuple[set[str], list[str]]:
    """Package directories, and whatever is left in the staging area."""
    root = server.home / "packages"
    stored = {p.name for p in (root / "sha256").iterdir()} if (root / "sha256").is_dir() else set()
    staging = sorted(p.name for p in (root / "staging").iterdir()) if (
        root / "staging").is_dir() else []
    return stored, staging


def files_outside_store(server: LiveServer) -> set[str]:
    """Every path under the test's temporary directory but outside the package store (and the
    warm pool's directory, whose server may still be starting and come up meanwhile)."""
    base = server.home.parent
    store, warm = server.home / "packages", server.home / "warm"
    return {
        str(p.relative_to(base)) for p in base.rglob("*")
        if not p.is_relative_to(store) and not p.is_relative_to(warm)
        and not p.name.startswith("server-")
    }


# --- upload, digest, HEAD ------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["zip", "tar.gz"])
def test_upload_is_stored_once_by_digest(client: httpx.Client, server: LiveServer,
                                         kind: str) -> None:
    body = make_zip(PROJECT) if kind == "zip" else make_tar(tar_files(PROJECT))
    digest = digest_of(body)
    assert client.head(f"/packages/{digest}").status_code == 404
    first = client.post("/packages", content=body,
                        headers={"Content-Type": "application/octet-stream"})
    assert first.status_code == 201, first.text
    assert first.json() == {"digest": digest, "size": len(body), "files": len(PROJECT)}
    assert first.headers["location"] == f"/packages/{digest}"
    again = client.post("/packages", content=body)
    assert again.status_code == 200 and again.json()["digest"] == digest
    head = client.head(f"/packages/{digest}")
    assert head.status_code == 200 and head.content == b""
    assert client.get(f"/packages/{digest}").json()["size"] == len(body)
    tree = server.home / "packages" / "sha256" / digest.removeprefix("sha256:") / "tree"
    assert (tree / "helper.py").read_bytes() == b"VALUE = 42\n"
    assert store_entries(server)[1] == []


def test_bad_digest_and_unknown_content(client: httpx.Client) -> None:
    assert client.head("/packages/sha256:xyz").status_code == 422
    r = client.post("/packages", content=b"just some text, not an archive")
    assert r.status_code == 415 and "zip or tar.gz" in r.json()["message"]
    assert client.post("/packages", content=b"").status_code == 415


def test_uploads_need_a_token(server: LiveServer) -> None:
    r = httpx.post(f"{server.url}/packages", content=make_zip(PROJECT))
    assert r.status_code == 401


def _incompressible(n: int) -> bytes:
    """Bytes no codec shrinks: the unpacked bound is reached before the ratio bound."""
    return random.Random(n).randbytes(n)


def _bomb() -> bytes:
    return make_zip({"zeros.bin": _incompressible(MAX_UNPACKED + 1024 * 1024)})


def _zip_with_flag(flag: int) -> bytes:
    """A zip whose one member sets general-purpose ``flag`` in both of its headers (bit 0:
    encrypted)."""
    raw = bytearray(make_zip({"secret.py": b"x = 1\n" * 100}))
    local, central = raw.find(b"PK\x03\x04"), raw.find(b"PK\x01\x02")
    raw[local + 6] |= flag
    raw[central + 8] |= flag
    return bytes(raw)


def _zip_corrupt_bzip2() -> bytes:
    """A zip whose member is bzip2 with its stream overwritten past the header."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_BZIP2) as zf:
        zf.writestr("model/weights.py", b"w = [0.5] * 1000\n" * 200)
    raw = bytearray(buf.getvalue())
    start = raw.find(b"BZh") + 10
    raw[start:start + 40] = b"\xff" * 40
    return bytes(raw)


def _zip_corrupt_deflate() -> bytes:
    raw = bytearray(make_zip({"broken.py": _incompressible(4096)}))
    start = raw.find(b"broken.py") + len("broken.py") + 20
    raw[start:start + 200] = b"\xff" * 200
    return bytes(raw)


DEEP_2100 = "a/" * 2100 + "x.py"
DEEP_65 = "d/" * 65 + "x.py"
LONG_DIR = "p" * 256 + "/"
LONG_FILE = "src/" + "f" * 300 + ".py"
LONG_NAME = "/".join(["n" * 200] * 6) + "/x.py"  # 6 levels of 200 bytes: over 1024 in all


def _zip_raw_name() -> bytes:
    """A zip whose member name is bytes that are not UTF-8 (no UTF-8 flag)."""
    return make_zip({"AAAA.py": b"x = 1\n"}).replace(b"AAAA.py", b"\xff\xfe\xfd\xfc.py")


def _zip_flagged_bad_utf8() -> bytes:
    """A zip that flags its names UTF-8 but holds bytes that are not."""
    raw = make_zip({"\u00e9AA.py": b"x = 1\n"})  # non-ASCII: zipfile sets the UTF-8 flag
    return raw.replace("\u00e9AA.py".encode(), b"\xff\xfeAA.py")


HOSTILE = {
    "zip-absolute": (lambda: make_zip({"/tmp/evil.py": b"x"}), "absolute"),
    "zip-dotdot": (lambda: make_zip({"../evil.py": b"x"}), "'..'"),
    "zip-dotdot-inner": (lambda: make_zip({"a/../../evil.py": b"x"}), "'..'"),
    "zip-symlink": (lambda: make_zip({"link": b"/etc/passwd"}, mode=stat.S_IFLNK | 0o777),
                    "symlink"),
    "zip-fifo": (lambda: make_zip({"fifo": b""}, mode=stat.S_IFIFO | 0o644), "regular files"),
    "zip-duplicate": (lambda: make_zip([("a.py", b"1"), ("a.py", b"2")]), "twice"),  # type: ignore[arg-type]
    "zip-not-utf8": (_zip_raw_name, "UTF-8"),
    "zip-flagged-not-utf8": (_zip_flagged_bad_utf8, "UTF-8"),
    "zip-too-many": (lambda: make_zip({f"f{i}.py": b"" for i in range(MAX_FILES + 1)}),
                     "more than"),
    "zip-bomb": (_bomb, "unpacks to more than"),
    # issue 44 item 2: each answered 500 (and the deep paths left their tree in staging)
    "zip-deep": (lambda: make_zip({DEEP_2100: b"x"}), "'a/a/a/a/a/a/a/a/a/a/a/a/a/a/a/"),
    "zip-deep-dir": (lambda: make_zip({DEEP_2100 + "/": b""}), "2101 levels deep, more "
                     "than 64 (TORCHYARD_PACKAGE_MAX_DEPTH)"),
    "zip-65-levels": (lambda: make_zip({DEEP_65: b"x"}), "66 levels deep, more than 64"),
    "zip-long-dir": (lambda: make_zip({LONG_DIR: b""}), "'ppppp"),
    "zip-long-file": (lambda: make_zip({LONG_FILE: b"x"}), "longer than 255 bytes"),
    "zip-long-name": (lambda: make_zip({LONG_NAME: b"x"}), "longer than 1024 bytes"),
    "zip-bzip2-corrupt": (_zip_corrupt_bzip2, "'model/weights.py': bzip2 compression is not "
                          "supported"),
    "zip-encrypted": (lambda: _zip_with_flag(0x1), "'secret.py': encrypted"),
    "zip-corrupt-deflate": (_zip_corrupt_deflate, "'broken.py': cannot be read"),
    # issue 44 item 12: the compression ratio, per member and per archive
    "zip-ratio-member": (lambda: make_zip({"zeros.bin": b"\0" * (3 * 1024 * 1024)}),
                         "'zeros.bin': inflates to more than 200 times its compressed size"),
    "zip-ratio-archive": (lambda: make_zip({f"z{i}.bin": b"\0" * 450_000 for i in range(8)}),
                          "the archive inflates to more than 200 times"),
    "tar-ratio": (lambda: make_tar(tar_files({"zeros.bin": b"\0" * (3 * 1024 * 1024)})),
                  "'zeros.bin': the archive inflates to more than 200 times"),
    "tar-absolute": (lambda: make_tar(tar_files({"/tmp/evil.py": b"x"})), "absolute"),
    "tar-dotdot": (lambda: make_tar(tar_files({"../evil.py": b"x"})), "'..'"),
    "tar-symlink": (lambda: make_tar(tar_special("link", tarfile.SYMTYPE, "/etc/passwd")),
                    "symlinks"),
    "tar-symlink-inside": (lambda: make_tar(tar_special("link", tarfile.SYMTYPE, "ok.py")),
                           "symlinks"),
    "tar-hardlink": (lambda: make_tar(tar_special("hard", tarfile.LNKTYPE, "/etc/passwd")),
                     "hardlinks"),
    "tar-chardev": (lambda: make_tar(tar_special("null", tarfile.CHRTYPE)), "regular files"),
    "tar-fifo": (lambda: make_tar(tar_special("fifo", tarfile.FIFOTYPE)), "regular files"),
    "tar-duplicate": (lambda: make_tar(lambda t: (tar_files({"a.py": b"1"})(t),
                                                  tar_files({"./a.py": b"2"})(t))), "twice"),
    "tar-not-utf8": (lambda: make_tar(tar_files({"\udcff\udcfe.py": b"x"})), "UTF-8"),
    "tar-too-many": (lambda: make_tar(tar_files({f"f{i}": b"" for i in range(MAX_FILES + 1)})),
                     "more than"),
    "tar-bomb": (lambda: make_tar(tar_files({"zeros.bin": _incompressible(MAX_UNPACKED + 1)})),
                 "unpacks to more than"),
    "tar-deep": (lambda: make_tar(tar_files({DEEP_2100: b"x"})), "2101 levels deep"),
    "tar-65-levels": (lambda: make_tar(tar_files({DEEP_65: b"x"})), "66 levels deep"),
    "tar-long-file": (lambda: make_tar(tar_files({LONG_FILE: b"x"})), "longer than 255 bytes"),
    "tar-truncated": (lambda: make_tar(tar_files(PROJECT))[:-200], "cannot be read"),
    "tar-file-then-dir": (lambda: make_tar(tar_files({"a": b"1", "a/b.py": b"2"})),
                          "same name"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_archive_is_refused_and_writes_nothing(
    client: httpx.Client, server: LiveServer, case: str
) -> None:
    build, words = HOSTILE[case]
    body = build()
    before_outside = files_outside_store(server)
    stored_before, _ = store_entries(server)
    r = client.post("/packages", content=body)
    assert r.status_code == 422, r.text
    assert r.json()["error"] == "invalid_package" and words in r.json()["message"], r.json()
    # Only the member's path inside the archive, never the server's (issue 44 item 15).
    assert str(server.home) not in r.text and "staging" not in r.text, r.text
    stored_after, staging = store_entries(server)
    assert stored_after == stored_before and staging == []
    assert files_outside_store(server) == before_outside
    assert client.head(f"/packages/{digest_of(body)}").status_code == 404


def test_upload_over_the_size_limit_is_413(client: httpx.Client, server: LiveServer) -> None:
    body = make_zip({"big.bin": bytes(range(256)) * 40_000}) + b"\0" * (8 * 1024 * 1024)
    assert client.post("/packages", content=body).status_code == 413

    def chunks() -> Iterator[bytes]:  # no Content-Length: refused while it streams
        yield from (body[i:i + 65536] for i in range(0, len(body), 65536))

    r = client.post("/packages", content=chunks())
    assert r.status_code == 413, r.text
    assert store_entries(server)[1] == []


def test_upload_cut_off_stores_nothing(server: LiveServer) -> None:
    body = make_zip({**PROJECT, "unique.txt": b"cut off"})
    stored_before, _ = store_entries(server)
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(
            b"POST /packages HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            + f"Authorization: Bearer {TOKEN}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body[: len(body) // 2]
        )
    # The server notices the disconnect; nothing is stored, no staging file stays.
    with server.client() as c:
        assert c.head(f"/packages/{digest_of(body)}").status_code == 404
        for _ in range(100):
            if store_entries(server)[1] == []:
                break
            c.get("/healthz")
    assert store_entries(server) == (stored_before, [])


def test_concurrent_uploads_of_the_same_content(server: LiveServer) -> None:
    body = make_zip({**PROJECT, "unique.txt": b"concurrent"})
    statuses: list[int] = []
    digests: list[str] = []

    def upload() -> None:
        with server.client() as c:
            r = c.post("/packages", content=body)
            statuses.append(r.status_code)
            digests.append(r.json()["digest"])

    threads = [threading.Thread(target=upload) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(statuses) == [200, 200, 200, 201] and set(digests) == {digest_of(body)}
    assert digest_of(body).removeprefix("sha256:") in store_entries(server)[0]
    assert store_entries(server)[1] == []


# --- the operator's switches ----------------------------------------------------------------


def _app_client(tmp_path: Path, **settings: object) -> TestClient:
    app = create_app(Settings(home=tmp_path / "home", cpu_slots=2, gpus="none", **settings),
                     run_supervisor=False)
    return TestClient(app, raise_server_exceptions=False)


def test_packages_off_and_without_tokens_are_403(tmp_path: Path) -> None:
    body = make_zip(PROJECT)
    with _app_client(tmp_path) as c:  # no API tokens: packages are code
        r = c.post("/packages", content=body)
        assert r.status_code == 403 and "API tokens" in r.json()["message"]
    with _app_client(tmp_path, api_tokens=[TOKEN], packages_enabled=False) as c:
        c.headers["Authorization"] = f"Bearer {TOKEN}"
        r = c.post("/packages", content=body)
        assert r.status_code == 403 and "PACKAGES_ENABLED" in r.json()["message"]
        spec = {"entrypoint": "train.py", "package": digest_of(body)}
        r = c.post("/jobs", json=spec)
        assert r.status_code == 403 and "PACKAGES_ENABLED" in r.json()["message"], r.text


def test_package_job_submit_checks(client: httpx.Client) -> None:
    body = make_zip(PROJECT)
    digest = client.post("/packages", content=body).json()["digest"]
    missing = "sha256:" + "0" * 64
    cases = [
        ({"entrypoint": "train.py", "package": missing}, "package", "not on this server"),
        ({"entrypoint": "nope.py", "package": digest}, "entrypoint", "the package"),
        ({"entrypoint": "/abs/train.py", "package": digest}, "entrypoint", "absolute"),
        ({"package": digest}, "package", "only allowed with 'entrypoint'"),
        ({"entrypoint": "train.py", "package": "md5:abc"}, "package", "pattern"),
    ]
    for spec, field, words in cases:
        r = client.post("/jobs", json=spec)
        assert r.status_code == 422, (spec, r.text)
        assert field in r.text and words in r.text, (spec, r.text)


# --- a package job, end to end ---------------------------------------------------------------


def test_package_job_runs_in_its_own_copy(client: httpx.Client, server: LiveServer) -> None:
    body = make_tar(tar_files(PROJECT))
    digest = client.post("/packages", content=body).json()["digest"]
    wait_warm(server, idle=1)
    results = []
    for _ in range(2):
        r = client.post("/jobs", json={"entrypoint": "train.py", "package": digest,
                                       "args": ["--epochs", "1"]})
        assert r.status_code == 201, r.text
        job = server.wait_for(r.json()["id"], {"succeeded"}, timeout_s=120)
        run = server.home / "runs" / str(job["id"])
        results.append((run, json.loads((run / "outputs" / "result.json").read_text())))
    for run, result in results:
        assert "starting cold" not in (run / "attempt-loop.log").read_text()  # it ran warm
        work = str((run / "work").resolve())
        assert result == {"value": 42, "config": {"lr": 0.5}, "seen_scratch": False,
                          "cwd": work, "path0": work, "args": ["--epochs", "1"]}
    tree = server.home / "packages" / "sha256" / digest.removeprefix("sha256:") / "tree"
    assert not (tree / "scratch.txt").exists()
    module = client.post("/jobs", json={"entrypoint": "-m pkg.main", "package": digest})
    assert module.status_code == 201, module.text
    server.wait_for(module.json()["id"], {"succeeded"}, timeout_s=120)
