"""The record wire format: what a rank POSTs to ``/jobs/{id}/records`` and appends to its spool.

One record per line of ``RUN_DIR/spool/rank-<rank>.jsonl`` and per item of a POSTed batch, in the
shape of :class:`RecordPost`. Strict JSON has no NaN or Infinity, so a non-finite value travels
as one of the strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"`` — the one non-finite codec,
used by the rank (:func:`encode_value`), the server's ingest (:func:`decode_value`), storage
(:func:`nonfinite_name`) and every read route (:func:`to_wire`).
"""

import math
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from torchyard_contract.spec_types import refuse_coercion

NonFinite = Literal["NaN", "Infinity", "-Infinity"]
MetricValue = float | NonFinite
_NAMES: dict[str, NonFinite] = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}
_VALUES: dict[str, float] = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def nonfinite_name(value: float) -> NonFinite | None:
    """``"NaN"``/``"Infinity"``/``"-Infinity"`` for a non-finite float, None for a finite one."""
    return None if math.isfinite(value) else _NAMES[repr(float(value))]


def to_wire(value: float) -> MetricValue:
    """A float as strict JSON carries it: itself when finite, else its name."""
    return nonfinite_name(value) or value


def decode_value(value: float | str) -> float:
    """The inverse of :func:`to_wire`; raises ``KeyError`` on a string that is not a name."""
    return _VALUES[value] if isinstance(value, str) else float(value)


def encode_value(value: Any) -> int | float | str:
    """Map a metric value a rank reports onto something strict JSON can carry.

    Bools become ints (JSON has no place for them in ``number-or-string``); non-finite
    floats become their names; anything with ``__float__`` (numpy/torch scalars) becomes a
    float; strings and ints pass through. Other types raise ``TypeError``.
    """
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int | str):
        return value
    if hasattr(value, "__float__"):
        return to_wire(float(value))
    raise TypeError(f"metric value must be a number or string, got {type(value).__name__}")


class RecordPost(BaseModel):
    """One record as a rank sends it (and spools it); ``value`` is decoded to a float."""

    model_config = ConfigDict(extra="forbid")

    attempt: int = Field(default=1, ge=1, le=10_000)
    rank: int = Field(ge=0, le=65_535)
    epoch: int | None = Field(default=None, ge=0, le=10_000_000)
    step: int | None = Field(default=None, ge=0, le=2**62)
    name: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:/-]+$")]
    value: MetricValue
    time: float = Field(ge=0, le=1e11, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _numbers_are_numbers(cls, data: object) -> object:
        # A rank sends JSON numbers; ``true`` or ``"5"`` is refused, not coerced.
        refuse_coercion(data, frozenset({"attempt", "rank", "epoch", "step", "time"}))
        value = data.get("value") if isinstance(data, dict) else None
        if isinstance(value, bool) or (isinstance(value, str) and value not in _VALUES):
            raise ValueError("value: must be a number or one of 'NaN', 'Infinity', '-Infinity'")
        return data

    @field_validator("value")
    @classmethod
    def _to_float(cls, v: MetricValue) -> float:
        return decode_value(v)
