"""Packing a working directory for ``torchyard submit --workdir``: a deterministic tar.gz.

Contract: :func:`pack` ``(directory, excludes) -> (archive path, sha256 digest)`` writes the
directory's regular files and directories (never ``.git``, nor what its top-level
``.gitignore`` or ``--exclude`` names: shell patterns, matched against the path relative to the
directory and against each name; a pattern ending in ``/`` matches directories) into a temporary
tar.gz with fixed times and owners, so unchanged code packs to the same bytes and the same
digest: a repeated submit costs one ``HEAD``. Symlinks are left out (the server refuses them).
"""

import fnmatch
import gzip
import hashlib
import io
import os
import tarfile
import tempfile
from pathlib import Path

ALWAYS_EXCLUDED = (".git/", "__pycache__/", "*.pyc")


def ignore_patterns(directory: Path, excludes: list[str]) -> list[str]:
    patterns = list(ALWAYS_EXCLUDED) + list(excludes)
    gitignore = directory / ".gitignore"
    if gitignore.is_file():
        for line in gitignore.read_text(encoding="utf-8", errors="replace").splitlines():
            line = line.strip()
            if line and not line.startswith(("#", "!")):
                patterns.append(line.lstrip("/"))
    return patterns


def _ignored(rel: str, is_dir: bool, patterns: list[str]) -> bool:
    name = rel.rsplit("/", 1)[-1]
    for pattern in patterns:
        if pattern.endswith("/"):
            if not is_dir:
                continue
            pattern = pattern[:-1]
        if fnmatch.fnmatchcase(rel, pattern) or fnmatch.fnmatchcase(name, pattern):
            return True
    return False


def members(directory: Path, excludes: list[str]) -> list[tuple[str, Path, bool]]:
    """(relative path, path, is a directory), sorted; what :func:`pack` puts in."""
    patterns = ignore_patterns(directory, excludes)
    found = []
    for root, dirs, files in os.walk(directory):
        base = Path(root)
        rel_base = base.relative_to(directory).as_posix()
        prefix = "" if rel_base == "." else f"{rel_base}/"
        kept = []
        for d in sorted(dirs):
            path = base / d
            if not path.is_symlink() and not _ignored(prefix + d, True, patterns):
                kept.append(d)
                found.append((prefix + d, path, True))
        dirs[:] = kept
        for f in sorted(files):
            path = base / f
            if path.is_symlink() or not path.is_file() or _ignored(prefix + f, False, patterns):
                continue
            found.append((prefix + f, path, False))
    return sorted(found)


def pack(directory: Path, excludes: list[str]) -> tuple[Path, str]:
    fd, name = tempfile.mkstemp(prefix="torchyard-", suffix=".tar.gz")
    archive = Path(name)
    with os.fdopen(fd, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz:
        with tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:  # type: ignore[call-overload]
            for rel, path, is_dir in members(directory, excludes):
                info = tarfile.TarInfo(rel)
                info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
                if is_dir:
                    info.type, info.mode = tarfile.DIRTYPE, 0o755
                    tar.addfile(info)
                    continue
                data = path.read_bytes()
                info.size = len(data)
                info.mode = 0o755 if os.access(path, os.X_OK) else 0o644
                tar.addfile(info, io.BytesIO(data))
    sha = hashlib.sha256()
    with archive.open("rb") as f:
        while chunk := f.read(1024 * 1024):
            sha.update(chunk)
    return archive, f"sha256:{sha.hexdigest()}"
