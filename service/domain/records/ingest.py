"""Accepting a job's records: one rule for both ways they arrive.

A rank's POST (``service.api.routes.records``) and the spool files re-ingested when the job ends
(``service.domain.loop.finisher``) both go through :func:`accept_records`: the records are checked
against what the job is (``service.domain.records.scope``), stored once (replays of (attempt, rank,
epoch, step, name) are ignored), the job's first-metric time is set, and the loss guard
(``service.domain.records.lossguard``) looks at what was added.
"""

from sqlalchemy.orm import Session

from service.domain.records import lossguard as guard
from service.domain.records.scope import JobFacts, RecordScope, Refusal
from service.store import records as recordstore
from service.store.records import RecordIn


class RecordsRefused(Exception):  # noqa: N818 — a refusal, not a failure of ours
    """A batch naming a rank or attempt the job does not have, or a job that is over."""

    def __init__(self, refusal: Refusal) -> None:
        super().__init__(refusal.message)
        self.refusal = refusal


def accept_records(
    session: Session, job: JobFacts, records: list[RecordIn], *, refuse_whole: bool
) -> int:
    """Store ``records`` of ``job`` in the caller's transaction; returns how many were new.
    ``job``: the ORM ``Job`` or ``service.store.records.job_for_records``'s row, read in this
    transaction.

    ``refuse_whole`` (a rank's POST): one record outside the job's scope refuses the batch
    (:class:`RecordsRefused`, nothing stored), so the rank learns of it. Otherwise (spool files,
    written by the job and read after it): such records are dropped and the rest stored.
    """
    scope = RecordScope.of(job)
    if refuse_whole:
        checked: set[tuple[int, int]] = set()
        for index, r in enumerate(records):
            if (r.rank, r.attempt) in checked:  # one check per (rank, attempt), not per record
                continue
            checked.add((r.rank, r.attempt))
            refused = scope.refusal(r.rank, r.attempt, where=f"records.{index}.")
            if refused is not None:
                raise RecordsRefused(refused)
    else:
        records = [r for r in records if scope.refusal(r.rank, r.attempt) is None]
    added = recordstore.insert_records(session, job.id, records)
    if added:
        recordstore.mark_first_metric(session, job.id, records, job.first_metric_at)
        guard.check(session, job.id, job.spec, records)  # a loss gone bad stops the job
    return added
