"""The package store: uploaded code, content-addressed, unpacked once, copied per job.

Layout under ``TORCHYARD_HOME/packages`` (on Slurm the home is shared, so every node sees it)::

    sha256/<hex>/tree/       the unpacked archive (read-only to jobs: each job gets a copy)
    sha256/<hex>/meta.json   {"digest", "size", "files", "unpacked_bytes"}
    staging/<random>/        an upload in progress (removed on failure, renamed when complete)

Contract:

* :meth:`PackageStore.add` takes a complete archive file (its SHA-256 already computed while
  it streamed in) and returns ``(info, created)``. It unpacks into a staging directory and
  renames it into place in one step, so a digest is either absent or complete; two uploads of
  the same content race harmlessly (the loser's copy is discarded, both answer the same digest).
  Raises :class:`service.domain.files.unpack.ArchiveRefused` or
  :class:`service.domain.files.diskspace.DiskFull` with nothing stored: the staging directory
  is removed whatever failed (iteratively, so no depth can keep it there).
* :meth:`PackageStore.get` reads a package's metadata (None when absent) and marks it used now.
* :meth:`PackageStore.copy_for_job` copies a package's tree into a job's run directory, so what
  one job writes never changes what another sees.
* :meth:`PackageStore.collect` removes packages not used for ``grace_s`` that no waiting job
  names (``service.domain.files.cleanup`` calls it). One entry it cannot read or remove is
  logged and left for the next pass; it never stops the rest of the pass.
"""

import json
import logging
import os
import re
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

from service.domain.files.unpack import ArchiveRefused, Limits, unpack
from service.settings import Settings
from torchyard_contract import runwrite
from torchyard_contract.treeremoval import remove_tree

logger = logging.getLogger(__name__)

DIGEST_PATTERN = r"^sha256:[0-9a-f]{64}$"


class PackageMissing(LookupError):
    """The job names a package this server does not hold (any more)."""


@dataclass(frozen=True)
class PackageInfo:
    digest: str
    size: int
    files: int
    unpacked_bytes: int


@dataclass(frozen=True)
class PackageStore:
    root: Path  # HOME/packages
    limits: Limits

    @property
    def staging(self) -> Path:
        return self.root / "staging"

    def _dir(self, digest: str) -> Path:
        if not re.fullmatch(DIGEST_PATTERN, digest):
            raise ValueError(f"package: {digest[:80]!r} is not 'sha256:' and 64 hex digits")
        return self.root / "sha256" / digest.removeprefix("sha256:")

    def tree(self, digest: str) -> Path:
        return self._dir(digest) / "tree"

    def new_upload(self) -> Path:
        """A fresh file in the staging area for an upload to stream into."""
        self.staging.mkdir(parents=True, exist_ok=True)
        return self.staging / f"{uuid.uuid4().hex}.upload"

    def add(self, upload: Path, digest: str, size: int) -> tuple[PackageInfo, bool]:
        """Store the archive ``upload`` (removed here, whatever happens) as ``digest``."""
        final = self._dir(digest)
        try:
            existing = self.get(digest)
            if existing is not None:
                return existing, False
            work = self.staging / uuid.uuid4().hex
            work.mkdir(parents=True)
            try:
                files, unpacked = unpack(upload, work / "tree", self.limits)
                info = PackageInfo(digest=digest, size=size, files=files, unpacked_bytes=unpacked)
                (work / "meta.json").write_text(json.dumps(asdict(info)))
                final.parent.mkdir(parents=True, exist_ok=True)
                try:
                    os.rename(work, final)  # atomic: the digest appears complete or not at all
                except OSError:
                    if not final.is_dir():
                        raise
                    return self.get(digest) or info, False  # a concurrent upload won
                return info, True
            finally:
                _remove_quietly(work)
        finally:
            upload.unlink(missing_ok=True)

    def get(self, digest: str) -> PackageInfo | None:
        meta = self._dir(digest) / "meta.json"
        try:
            info = PackageInfo(**json.loads(meta.read_text()))
        except FileNotFoundError:
            return None
        try:
            os.utime(meta)  # used now: collect() keeps it for another grace period
        except OSError:
            pass
        return info

    def copy_for_job(self, digest: str, dest: Path) -> None:
        """Copy the package's tree to ``dest`` (replaced if there: a relaunch starts clean),
        confined and owned as the run directory is (``torchyard_contract.runwrite``: the
        directory may be the job's user's, who could swap a path for a link mid-copy)."""
        tree = self.tree(digest)
        if not tree.is_dir():
            raise PackageMissing(f"package: {digest} is not on this server (upload it again)")
        self.get(digest)
        try:
            runwrite.replace_tree(tree, dest)  # confined: the run directory may be a user's
        except RecursionError:  # stored before TORCHYARD_PACKAGE_MAX_DEPTH bounded uploads
            _remove_quietly(dest)
            raise OSError(f"package: {digest} is nested too deeply to copy (upload it again "
                          "within TORCHYARD_PACKAGE_MAX_DEPTH)") from None

    def collect(self, grace_s: float, in_use: set[str], now: float | None = None) -> list[str]:
        """Remove packages unused for ``grace_s`` and not in ``in_use``; returns their digests.
        Leftover staging entries older than the grace go too."""
        now = time.time() if now is None else now
        removed = []
        for entry in _entries(self.root / "sha256"):
            digest = f"sha256:{entry.name}"
            if digest in in_use:
                continue
            if entry.name.startswith("."):  # renamed aside by an earlier pass, not removed
                _remove_quietly(entry)
                continue
            try:
                if self._collect_one(entry, grace_s, now):
                    removed.append(digest)
            except Exception:  # one bad tree never blocks the rest of the pass
                logger.warning("package %s: not collected (left for the next pass)", digest,
                               exc_info=True)
        for stale in _entries(self.staging):
            try:
                if now - stale.lstat().st_mtime >= grace_s:
                    remove_tree(stale)
            except FileNotFoundError:
                pass
            except Exception:
                logger.warning("package staging %s: not removed (left for the next pass)",
                               stale.name, exc_info=True)
        return removed

    def _collect_one(self, entry: Path, grace_s: float, now: float) -> bool:
        try:
            last_used = (entry / "meta.json").stat().st_mtime
        except OSError:  # no metadata (a half-removed or foreign entry): its own age
            last_used = entry.lstat().st_mtime
        if now - last_used < grace_s:
            return False
        gone = entry.with_name(f".{entry.name}.{uuid.uuid4().hex}.gone")
        try:
            os.rename(entry, gone)  # a job copying it now fails cleanly, never half-way
        except FileNotFoundError:
            return False  # collected meanwhile
        remove_tree(gone)
        logger.info("package sha256:%s: collected (unused for %.0f s)", entry.name,
                    now - last_used)
        return True


def package_store(settings: Settings) -> PackageStore:
    return PackageStore(settings.packages_dir, Limits(
        max_files=settings.package_max_files,
        max_unpacked_bytes=settings.package_max_unpacked_bytes,
        max_depth=settings.package_max_depth,
        max_ratio=settings.package_max_ratio,
        free_floor_bytes=settings.disk_free_floor_bytes,
    ))


def _entries(directory: Path) -> list[Path]:
    """The entries of ``directory``, sorted; none when it is missing or unreadable."""
    try:
        return sorted(directory.iterdir())
    except OSError:
        return []


def _remove_quietly(path: Path) -> None:
    """Remove ``path`` as far as it goes; what is left is logged, never raised (a leftover
    staging directory or renamed-aside package goes at a later pass)."""
    try:
        remove_tree(path)
    except OSError:
        logger.warning("package store: %s not removed (left for the next pass)", path.name,
                       exc_info=True)


__all__ = ["ArchiveRefused", "PackageInfo", "PackageMissing", "PackageStore", "DIGEST_PATTERN", "package_store"]
