"""The package store on disk (issue 44, items 3 and 12): the free-space floor checked while an
archive inflates, trees of any depth removed, and collection that no bad entry can stop.

The archives are made here with the standard library; the stores are real directories under
the test's temporary directory (the collection pass is :meth:`PackageStore.collect`, the one
the supervisor's clean-up pass calls).
"""

import io
import json
import os
import tarfile
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.domain.files.diskspace import free_bytes
from service.domain.files.packages import PackageStore
from service.domain.files.unpack import Limits
from service.settings import Settings
from torchyard_contract.treeremoval import remove_tree

TOKEN = "package-store-tests-token-0123456789"
MIB = 1024 * 1024


def _zeros_archive(kind: str, size: int) -> bytes:
    zeros = b"\0" * size
    buf = io.BytesIO()
    if kind == "zip":
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
            zf.writestr("data/zeros.bin", zeros)
    else:
        with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=1) as tar:
            info = tarfile.TarInfo("data/zeros.bin")
            info.size = size
            tar.addfile(info, io.BytesIO(zeros))
    return buf.getvalue()


def _nest(root: Path, depth: int, name: str = "d") -> None:
    """``root/name/name/…`` ``depth`` levels deep, with a file at the bottom, made one level at a
    time relative to the last (the whole path may be longer than PATH_MAX)."""
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir(name, dir_fd=fd)
            child = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = child
        os.close(os.open("bottom.py", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd))
    finally:
        os.close(fd)


@pytest.fixture
def deep_tmp(tmp_path: Path) -> Iterator[Path]:
    """``tmp_path``, emptied after the test whatever happened: pytest removes old temporary
    directories with ``shutil.rmtree``, which a tree left 1,000 deep would stop (RecursionError)."""
    yield tmp_path
    for entry in tmp_path.iterdir():
        remove_tree(entry)


@pytest.mark.parametrize("kind", ["zip", "tar.gz"])
def test_floor_crossed_while_unpacking_is_507(tmp_path: Path, kind: str) -> None:
    """The floor sits 32 MiB under today's free space; the archive inflates to 128 MiB (the
    ratio bound is lifted so that it is the floor that stops it, not the ratio)."""
    body = _zeros_archive(kind, 128 * MIB)
    home = tmp_path / "home"
    home.mkdir()
    settings = Settings(
        home=home, cpu_slots=2, gpus="none", api_tokens=[TOKEN],
        disk_free_floor_bytes=free_bytes(home) - 32 * MIB, package_max_ratio=1_000_000,
    )
    with TestClient(create_app(settings, run_supervisor=False), raise_server_exceptions=False,
                    headers={"Authorization": f"Bearer {TOKEN}"}) as c:
        r = c.post("/packages", content=body)
    assert r.status_code == 507, r.text
    message = r.json()["message"]
    assert r.json()["error"] == "insufficient_storage"
    assert "'data/zeros.bin': while unpacking" in message, message
    assert "TORCHYARD_DISK_FREE_FLOOR_BYTES" in message and "readable" not in message, message
    assert str(home) not in message
    packages = home / "packages"
    assert list((packages / "staging").iterdir()) == []
    assert not (packages / "sha256").exists() or list((packages / "sha256").iterdir()) == []


def test_collection_passes_a_deep_package_and_a_bad_entry(deep_tmp: Path) -> None:
    tmp_path = deep_tmp
    """A 1,000-deep package (stored before uploads were bounded), an entry that is a dangling
    symlink, and a 1,200-deep leftover in staging: one pass removes all of them and the
    ordinary package after them (shutil.rmtree raised RecursionError, and the dangling entry
    FileNotFoundError, out of the whole pass)."""
    store = PackageStore(tmp_path / "packages", Limits(max_files=10, max_unpacked_bytes=10**6))
    base = store.root / "sha256"
    base.mkdir(parents=True)
    dangling, deep, plain = "0" * 64, "1" * 64, "2" * 64
    (base / dangling).symlink_to(tmp_path / "gone-already")
    _nest(base / deep / "tree", 1000)
    (base / deep / "meta.json").write_text("{}")
    (base / plain / "tree").mkdir(parents=True)
    (base / plain / "meta.json").write_text("{}")
    _nest(store.staging / "abandoned", 1200)
    old = time.time() - 1000
    for path in (base / dangling, base / deep / "meta.json", base / plain / "meta.json",
                 store.staging / "abandoned"):
        os.utime(path, (old, old), follow_symlinks=False)
    removed = store.collect(grace_s=500, in_use=set())
    assert removed == [f"sha256:{d}" for d in (dangling, deep, plain)]
    assert list(base.iterdir()) == [] and list(store.staging.iterdir()) == []


def test_copy_of_a_package_too_deep_to_copy_fails_cleanly(deep_tmp: Path) -> None:
    tmp_path = deep_tmp
    store = PackageStore(tmp_path / "packages", Limits(max_files=10, max_unpacked_bytes=10**6))
    digest = "sha256:" + "3" * 64
    _nest(store.tree(digest), 1200)
    (store.tree(digest).parent / "meta.json").write_text(json.dumps(
        {"digest": digest, "size": 1, "files": 1, "unpacked_bytes": 1}))
    dest = tmp_path / "run" / "work"
    dest.parent.mkdir()  # the job's run directory
    with pytest.raises(OSError, match="nested too deeply"):
        store.copy_for_job(digest, dest)
    assert not dest.exists()


def test_remove_tree_any_depth_never_through_a_link(deep_tmp: Path) -> None:
    tmp_path = deep_tmp
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep")
    root = tmp_path / "tree"
    _nest(root, 1100, name="dir-name")  # 9,900 bytes of path: past PATH_MAX
    level = root
    for _ in range(3):  # links to a directory and a file outside, at a few levels
        (level / "to-dir").symlink_to(outside)
        (level / "to-file").symlink_to(outside / "keep.txt")
        level = level / "dir-name"
    (root / "dir-name" / "read-only").mkdir()
    (root / "dir-name" / "read-only" / "f").write_text("x")
    (root / "dir-name" / "read-only").chmod(0o500)
    remove_tree(root)
    assert not root.exists()
    assert [p.name for p in outside.iterdir()] == ["keep.txt"]
    remove_tree(root)  # missing: nothing to do, no error
    link = tmp_path / "link"
    link.symlink_to(outside)
    remove_tree(link)  # a link is removed as itself
    assert not link.is_symlink() and (outside / "keep.txt").read_text() == "keep"
    single = tmp_path / "file.txt"
    single.write_text("x")
    remove_tree(single)
    assert not single.exists()
