"""Removing jobs: ``DELETE /jobs/{id}``, retention, and collecting unused packages.

Contract:

* :meth:`Cleanup.delete` removes a terminal job with everything it left: its rows in every
  job-owned table (``service.store.deletion.JOB_OWNED_TABLES``: records, labels, allocations;
  its finished webhook deliveries — pending ones are still sent, ``domain.webhooks``), its run
  directory (logs, checkpoints, outputs, its copy of a package). Raises :class:`JobNotFound` or :class:`JobLive` (a job still queued or running:
  cancel it first). The run directory is first renamed aside, then the rows go (the records in
  batches, then every other row in one transaction), then the files: a failure before the
  rows are gone renames the directory back and leaves the whole job; once they are gone the
  job is gone, and the renamed-aside files are removed then, or, where that fails (a file the
  server's user may not remove), logged and left to the next pass, which removes
  renamed-aside directories of jobs that no longer exist. The request never fails on files.
* :meth:`Cleanup.sweep` is one pass of the background work, run by the acting supervisor at most
  every ``TORCHYARD_RETENTION_SWEEP_S``: terminal jobs that ended more than
  ``TORCHYARD_RETENTION_DAYS`` ago are deleted (at most :data:`SWEEP_JOBS` a pass, their records
  in batches of :data:`RECORD_BATCH`, each batch its own short transaction, so writers never
  wait long); packages no queued or running job names are collected after
  ``TORCHYARD_PACKAGE_GRACE_S`` (with the teams' grants of them); run directories whose job no
  longer exists are removed; audit log entries older than ``TORCHYARD_AUDIT_RETENTION_DAYS``
  are deleted (at most :data:`AUDIT_BATCH` a pass). Each job, package and directory is its own
  try: one that fails is logged and retried on the next pass, and never keeps the pass from the
  others.

Trees are removed by ``torchyard_contract.treeremoval.remove_tree`` (no depth limit: a job's
1,200 nested folders are removed like any other tree).
"""

import logging
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

from sqlalchemy.orm import Session, sessionmaker

from service.domain.files.packages import package_store
from service.settings import Settings
from service.store import audit, deletion
from service.store import identity as identitystore
from service.store import repository as repo
from torchyard_contract.rundir import RunDir
from torchyard_contract.state import TERMINAL_STATES, JobState
from torchyard_contract.treeremoval import remove_tree

logger = logging.getLogger(__name__)

SWEEP_JOBS = 50  # jobs deleted per retention pass
RECORD_BATCH = 5000  # metric records per delete transaction
AUDIT_BATCH = 5000  # audit log entries deleted per pass
ASIDE_PREFIX = ".deleting-"
ORPHAN_AGE_S = 300.0  # a run directory without a job is removed once it is this old


class JobNotFound(LookupError):
    pass


class JobLive(RuntimeError):
    """The job is queued or running; it must be cancelled before it can be deleted."""


@dataclass
class Cleanup:
    settings: Settings
    sessions: sessionmaker[Session]
    # Called in a transaction of its own before a terminal job's rows go (while its records are
    # still there): a sweep copies how its trial ended into its own record (Sweeps.settle).
    before_delete: Callable[[Session, int], None] | None = None
    _last_sweep: float = field(default=0.0)

    def delete(self, job_id: int) -> None:
        with self.sessions() as session:
            state = repo.job_state(session, job_id)
        if state is None:
            raise JobNotFound(f"job {job_id} not found")
        if JobState(state) not in TERMINAL_STATES:
            raise JobLive(
                f"job {job_id} is {state}; cancel it first (POST /jobs/{job_id}/cancel), then "
                "delete it once it has ended"
            )
        self._delete_terminal(job_id)

    def _delete_terminal(self, job_id: int) -> bool:
        run = RunDir.for_job(self.settings.runs_dir, job_id)
        aside = run.root.with_name(f"{ASIDE_PREFIX}{job_id}-{uuid.uuid4().hex}")
        moved = _rename(run.root, aside)
        try:
            if self.before_delete is not None:
                with self.sessions() as session:
                    self.before_delete(session, job_id)
                    session.commit()
            while True:  # a long history goes in short transactions
                with self.sessions() as session:
                    n = deletion.delete_record_batch(session, job_id, RECORD_BATCH)
                    session.commit()
                if n < RECORD_BATCH:
                    break
            with self.sessions() as session:
                deleted = deletion.delete_job_rows(session, job_id)
                session.commit()
        except BaseException:
            if moved:
                _rename(aside, run.root)
            raise
        if not deleted:
            if moved:
                _rename(aside, run.root)
            raise JobNotFound(f"job {job_id} not found")
        if moved:
            try:
                remove_tree(aside)
            except OSError as exc:  # the rows are gone: the next pass takes what is left
                logger.warning("job %s: deleted; its files %s are left to the next clean-up "
                               "pass: %s", job_id, aside, exc)
        logger.info("job %s: deleted", job_id)
        return True

    def sweep(self, now: float | None = None) -> None:
        """One background pass (see the module docstring), when one is due."""
        now = time.time() if now is None else now
        if now - self._last_sweep < self.settings.retention_sweep_s:
            return
        self._last_sweep = now
        if self.settings.retention_days is not None:
            cutoff = repo.utcnow() - timedelta(days=self.settings.retention_days)
            with self.sessions() as session:
                old = deletion.terminal_jobs_ended_before(session, cutoff, SWEEP_JOBS)
            for job_id in old:
                try:
                    self._delete_terminal(job_id)
                except JobNotFound:
                    pass  # deleted meanwhile
                except Exception:
                    logger.exception("job %s: retention could not delete it (next pass)", job_id)
        with self.sessions() as session:
            in_use = deletion.packages_in_use(session)
            known = deletion.job_ids(session)
        removed = package_store(self.settings).collect(self.settings.package_grace_s, in_use, now)
        cutoff = repo.utcnow() - timedelta(days=self.settings.audit_retention_days)
        with self.sessions() as session:
            identitystore.drop_package_grants(session, removed)
            audit.prune(session, cutoff, AUDIT_BATCH)
            session.commit()
        self._remove_orphans(known)

    def _remove_orphans(self, known: set[int]) -> None:
        """Run directories of jobs that no longer exist (a delete interrupted after its commit),
        and renamed-aside ones left by a crash."""
        runs = self.settings.runs_dir
        for entry in runs.iterdir() if runs.is_dir() else []:
            name = entry.name
            try:
                if time.time() - entry.stat().st_mtime < ORPHAN_AGE_S:
                    continue  # young: never race a launch
            except FileNotFoundError:
                continue
            job = name.removeprefix(ASIDE_PREFIX).split("-", 1)[0] if name.startswith(
                ASIDE_PREFIX) else name
            if not job.isdigit() or int(job) in known:
                continue
            try:
                remove_tree(entry)
            except OSError as exc:
                logger.warning("run directory %s of deleted job %s: not removed (next pass): "
                               "%s", entry, job, exc)


def _rename(src: Path, dst: Path) -> bool:
    try:
        os.rename(src, dst)
    except FileNotFoundError:
        return False
    return True
