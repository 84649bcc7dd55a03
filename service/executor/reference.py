"""A local job's reference: what the server stores to find the job's attempt loop again.

A JSON object: the attempt loop's ``pid``, its ``create_time`` and ``start_ticks`` (its start in
clock ticks since boot, what tells it from a reused pid across a wall-clock step), and the
``host`` it runs on. Pure: no process is looked at here (the local executor does that), so the
HTTP side can show a job's pid without importing an executor.
"""

import json
from collections.abc import Mapping

NAME = "local"  # the executor's name, stored with each job it started


def encode_reference(
    pid: int, started: float | None, host: str | None = None, ticks: int | None = None
) -> str:
    """``ticks``: the attempt loop's start in clock ticks since boot (``proctree.start_ticks``), what
    identifies it across a wall-clock step; older references have only ``create_time``."""
    data: dict[str, object] = {"pid": pid, "create_time": started}
    if host is not None:
        data["host"] = host
    if ticks is not None:
        data["start_ticks"] = ticks
    return json.dumps(data)


def reference_host(reference: str) -> str | None:
    """The host a local reference names; None when it names none (older references)."""
    try:
        host = json.loads(reference).get("host")
    except (ValueError, AttributeError):
        return None
    return host if isinstance(host, str) else None


def decode_reference(reference: str) -> tuple[int, float | None, int | None] | None:
    """(pid, create time, start ticks or None) of a local reference; None when it is not one."""
    try:
        data = json.loads(reference)
        return (int(data["pid"]),
                None if data["create_time"] is None else float(data["create_time"]),
                _ticks(data.get("start_ticks")))
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


def claim_reference(claim: Mapping[str, object]) -> str | None:
    """The reference of the attempt loop that wrote ``claim`` (``torchyard_contract.claim``: its pid,
    start and host), None when the claim names no process."""
    pid, started, host = claim.get("pid"), claim.get("create_time"), claim.get("host")
    if not isinstance(pid, int) or not isinstance(started, int | float):
        return None
    return encode_reference(pid, float(started), host if isinstance(host, str) else None,
                            _ticks(claim.get("start_ticks")))


def _ticks(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def attempt_loop_pid(executor: str | None, reference: str | None) -> int | None:
    """The attempt loop's pid of a job the local executor started (``JobRead.pid``); None for any other."""
    if executor != NAME or reference is None:
        return None
    decoded = decode_reference(reference)
    return decoded[0] if decoded else None
