"""Re-ingesting a rank's spool file (``spool/rank-<r>.jsonl``): what a rank could not send.

Each line is one record in the shape ranks POST (``RecordPost``); the reporter appends every
record there before sending it. When a job ends, the server reads back what the API did not
store — bounded, so that no spool can stall the server (issue 17):

* **incremental**: the reporter keeps ``spool/rank-<r>.ack`` (``RunDir.spool_ack_file``), the
  byte offset up to which the
  API answered every record; reading starts there (an ack that is not a number within the file
  means 0);
* **bounded**: at most ``max_records`` records per rank; what is left is reported (the job's
  reason says so) and stays in the file;
* **batched**: records come in lists of at most ``batch_size``, each stored in its own short
  transaction by the caller, so the write lock is free between them;
* **strict**: only the spool files of ranks the job has, regular files only, lines of at most
  ``LINE_MAX_BYTES``, records of the file's own rank; a torn or malformed line is skipped.

Ingestion is idempotent, so reading a record the API did store is harmless.
"""

import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from service.store.records import RecordIn
from torchyard_contract.records import RecordPost
from torchyard_contract.rundir import RunDir
from torchyard_contract.safefile import open_regular, read_bytes

logger = logging.getLogger(__name__)

LINE_MAX_BYTES = 4096  # a record is ~150 bytes; a longer line is not one
SPOOL_BATCH = 1000


@dataclass
class SpoolChunk:
    """Records read from one rank's file; ``end``: the byte offset reached."""

    rank: int
    records: list[RecordIn]
    end: int


@dataclass
class SpoolTally:
    """What reading one rank's file found."""

    rank: int
    read: int = 0
    malformed: int = 0
    bytes_left: int = 0  # not read: over the record cap

    def describe(self, path: Path) -> str | None:
        """A sentence for the job's reason when records were left unread; None otherwise."""
        if not self.bytes_left:
            return None
        return (f"rank {self.rank}: spool re-ingestion stopped after {self.read} records; "
                f"{self.bytes_left} bytes not ingested (they are in {path})")


def acked_offset(run: RunDir, rank: int, size: int) -> int:
    """Where reading starts: the reporter's acknowledged offset when it is one, else 0."""
    raw = read_bytes(run.spool_ack_file(rank), 32)
    try:
        offset = int(raw.decode("ascii").strip()) if raw else 0
    except (UnicodeDecodeError, ValueError):
        return 0
    return offset if 0 <= offset <= size else 0


def read_rank_spool(
    run: RunDir, rank: int, tally: SpoolTally, max_records: int, batch_size: int = SPOOL_BATCH,
) -> Iterator[SpoolChunk]:
    """Chunks of the rank's unacknowledged records, from its ack offset; counts in ``tally``."""
    path = run.spool_file(rank)
    f = open_regular(path)
    if f is None:
        if path.exists() or path.is_symlink():
            logger.warning("spool %s is not a regular file; skipped", path)
        return
    with f:
        size = _size(f)
        offset = acked_offset(run, rank, size)
        f.seek(offset)
        records: list[RecordIn] = []
        while True:
            if tally.read >= max_records:
                tally.bytes_left = max(0, size - offset)
                break
            line = f.readline(LINE_MAX_BYTES + 1)
            if not line:
                break
            offset += len(line)
            if len(line) > LINE_MAX_BYTES and not line.endswith(b"\n"):
                offset += _skip_line(f)
                tally.malformed += 1
                continue
            record = _parse(line, rank)
            if record is None:
                tally.malformed += 1
                continue
            records.append(record)
            tally.read += 1
            if len(records) >= batch_size:
                yield SpoolChunk(rank, records, offset)
                records = []
        if records:
            yield SpoolChunk(rank, records, offset)
    if tally.malformed:
        logger.warning("spool %s: %d malformed lines skipped", path, tally.malformed)


def _parse(line: bytes, rank: int) -> RecordIn | None:
    try:
        r = RecordPost.model_validate_json(line)
    except (ValueError, ValidationError):
        return None
    if r.rank != rank:  # a rank's file holds its own records only
        return None
    return RecordIn(r.attempt, r.rank, r.epoch, r.step, r.name, r.value, r.time)  # type: ignore[arg-type]


def _skip_line(f) -> int:  # type: ignore[no-untyped-def]
    """Read past the rest of an over-long line; returns the bytes skipped."""
    skipped = 0
    while True:
        chunk = f.readline(64 * 1024)
        skipped += len(chunk)
        if not chunk or chunk.endswith(b"\n"):
            return skipped


def _size(f) -> int:  # type: ignore[no-untyped-def]
    return os.fstat(f.fileno()).st_size
