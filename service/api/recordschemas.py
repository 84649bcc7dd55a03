"""HTTP shapes of records: a batch a rank posts (parsed in one strict pydantic-core pass), what
the post answers, and a page of metrics as polls and event streams read it."""

import dataclasses
from typing import Annotated

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    create_model,
)
from pydantic.dataclasses import dataclass as pydantic_dataclass
from pydantic_core import PydanticUndefined

from service.store.records import EPOCH_STEP, RecordIn
from service.store.tables import MetricRecord
from torchyard_contract.records import MetricValue, NonFinite, RecordPost, decode_value
from torchyard_contract.state import JobState


class MetricRead(BaseModel):
    seq: int
    attempt: int
    rank: int
    epoch: int
    step: int | None
    name: str
    value: MetricValue
    time: float

    @classmethod
    def from_row(cls, r: MetricRecord) -> "MetricRead":
        return cls(
            seq=r.seq,
            attempt=r.attempt,
            rank=r.rank,
            epoch=r.epoch,
            step=None if r.step == EPOCH_STEP else r.step,
            name=r.name,
            value=r.nonfinite if r.nonfinite else r.value,  # type: ignore[arg-type]
            time=r.time,
        )


def metric_item(r: MetricRecord) -> dict[str, object]:
    """A stored record (a row or a ``MetricRecord``) as the ``MetricRead`` it reads as: its
    fields in order, for pydantic-core to serialize (``pydantic_core.to_json``) without a
    model per record. The hot reads (polls, event streams) write pages this way; building
    and dumping a ``MetricRead`` per record was a tenth of a poll's CPU (docs/benchmarks.md
    §7). ``tests/api/test_hotreads.py`` checks both write the same bytes."""
    return {
        "seq": r.seq, "attempt": r.attempt, "rank": r.rank, "epoch": r.epoch,
        "step": None if r.step == EPOCH_STEP else r.step, "name": r.name,
        "value": r.nonfinite if r.nonfinite else r.value, "time": r.time,
    }


class MetricsPage(BaseModel):
    job_id: int
    state: JobState
    items: list[MetricRead]
    next_after: int = Field(description="pass as ?after= next time; unchanged when nothing is new")


class RecordBatch(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # Ranks send at most 500 (``worker.reporter.BATCH_MAX``); 1000 bounds one request to well under a second
    # of SQL work (10,000 took ~10 s on 2 busy cores: one caller could hold the write lock).
    records: list[RecordPost] = Field(max_length=1000)


# RecordPost's fields and bounds, validated entirely inside pydantic-core, straight into the
# records the store takes: strict types (a JSON integer for an integer; a number or one of the
# three names for a value) and no Python call per record. A third of RecordBatch's CPU on a
# 1000-record batch (docs/benchmarks.md, "Stores and API processes"), and half of that again by
# building no model per record: pydantic-core fills a slotted dataclass that *is* a
# ``RecordIn`` (issue 50). It takes a subset of what RecordBatch takes, so a body it refuses
# goes to RecordBatch, which decides (it also takes 5.0 for the integer 5) and words the errors.
def _strict_record_type() -> type[RecordIn]:
    annotations: dict[str, object] = {}
    defaults: dict[str, object] = {}
    for name in (f.name for f in dataclasses.fields(RecordIn)):
        info = RecordPost.model_fields[name]
        if name == "value":
            # A JSON number too large for a float (1e400) would read as inf; RecordBatch
            # refuses it. A name is decoded to its float by the one Python call, names only.
            annotations[name] = (Annotated[float, Field(allow_inf_nan=False)]
                                 | Annotated[NonFinite, AfterValidator(decode_value)])
        else:
            annotations[name] = (Annotated[(info.annotation, *info.metadata)]  # type: ignore[misc]
                                 if info.metadata else info.annotation)
        if info.default is not PydanticUndefined:
            defaults[name] = info.default
    namespace = {"__annotations__": annotations, "__module__": __name__, **defaults}
    return pydantic_dataclass(  # type: ignore[no-any-return]
        type("StrictRecord", (RecordIn,), namespace), frozen=True, slots=True, kw_only=True,
        config=ConfigDict(strict=True, extra="forbid"),
    )


_StrictRecord = _strict_record_type()
_StrictBatch = create_model(
    "StrictBatch", __config__=ConfigDict(extra="forbid"),
    records=(list[_StrictRecord], RecordBatch.model_fields["records"]),  # type: ignore[valid-type]
)


def parse_record_batch(body: bytes) -> list[RecordIn]:
    """The records of a ``RecordBatch`` JSON body, values decoded to floats. Raises pydantic's
    ``ValidationError`` (RecordBatch's) when the body is not one."""
    try:
        return _StrictBatch.model_validate_json(body).records  # type: ignore[attr-defined,no-any-return]
    except ValidationError:
        records = RecordBatch.model_validate_json(body).records
    return [
        RecordIn(r.attempt, r.rank, r.epoch, r.step, r.name, r.value, r.time)  # type: ignore[arg-type]
        for r in records
    ]


class IngestResult(BaseModel):
    accepted: int = Field(description="records stored now")
    duplicates: int = Field(description="records already stored (replays), ignored")
