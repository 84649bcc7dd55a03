"""Re-ingesting the ranks' spool files (``spool/rank-<N>.jsonl``): what a rank could not send.

Each line is one record in the contract's wire format (``torchyard_contract.records``), as ranks
POST. A torn last line (a rank killed mid-write) or any malformed line is skipped. Ingestion is idempotent, so replaying a whole spool is safe.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from pydantic import ValidationError

from service.repository import RecordIn
from torchyard_contract.records import RecordPost

logger = logging.getLogger(__name__)


def read_spool(spool_dir: Path) -> list[RecordIn]:
    records: list[RecordIn] = []
    for path in sorted(spool_dir.glob("rank-*.jsonl")):
        with path.open(encoding="utf-8", errors="replace") as fh:
            for number, line in enumerate(fh, 1):
                try:
                    r = RecordPost.model_validate(json.loads(line))
                except (ValueError, ValidationError):
                    logger.warning("spool %s line %d unreadable; skipped", path, number)
                    continue
                records.append(RecordIn(r.attempt, r.rank, r.epoch, r.step, r.name,
                                        r.value, r.time))  # type: ignore[arg-type]
    return records
