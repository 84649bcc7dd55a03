"""Per-rank metric reporting: spool to disk first, then send to the API in the background.

Contract:

* :meth:`Reporter.report` appends one JSON line per metric to
  ``RUN_DIR/spool/rank-<rank>.jsonl`` (flushed) *before* queueing it for sending, so the
  spool is the durable record even if the API never hears about it. No ``RUN_DIR`` → no
  spool.
* A record the server would refuse (a metric name outside ``[A-Za-z0-9_.:/-]{1,64}``, a
  negative epoch, ...) raises ``ValueError`` from :meth:`Reporter.report`, naming the field,
  before anything of that call is spooled or sent: a typo shows up in the script at once, and
  one bad name never costs the other records of a batch.
* A daemon thread POSTs batches to ``{api}/jobs/{job_id}/records`` with a bearer token.
  Connection errors, 5xx and 429 are retried with capped exponential backoff, waiting at least
  the answer's ``Retry-After`` seconds (at most ``RETRY_AFTER_MAX_S``; the server sends one
  with a 503 when its database is busy); other 4xx drop the batch with a warning. The server dedups on (job, attempt, rank, epoch, step,
  name), so retries and replays of the spool are safe.
* Once the API answered a batch (stored, or refused for good), the byte offset in the spool
  up to which every record was answered goes to ``RUN_DIR/spool/rank-<rank>.ack``; the server
  re-ingests the spool only from there when the job ends.
* Records are in the contract's wire format (``torchyard_contract.records``): non-finite
  floats become the strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"`` so the body (and the
  spool) is strict JSON.
* :meth:`Reporter.close` waits at most ``timeout_s`` for pending records; training never
  blocks on the API beyond that.
* Without ``TORCHYARD_API_URL``/``TORCHYARD_JOB_ID`` the reporter does not send anything
  (one warning per process) but still spools.

No torch import here: user code may import ``worker`` cheaply.
"""

import json
import logging
import os
import queue
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from pydantic import ValidationError

from torchyard_contract.records import RecordPost, encode_value
from torchyard_contract.rundir import RunDir
from worker.env import WorkerEnv

log = logging.getLogger(__name__)

Value = int | float | str
BATCH_MAX = 500
BACKOFF_START_S = 0.2
BACKOFF_CAP_S = 5.0
HTTP_TIMEOUT_S = 10.0
RETRY_AFTER_MAX_S = 60.0

# Put on the queue by close() to wake the sender; never sent.
_WAKE: dict[str, Any] = {}

_noop_warned = False
_noop_warned_lock = threading.Lock()


class Reporter:
    """Reports one rank's records; thread-safe; cheap when there is no API."""

    def __init__(self, env: WorkerEnv) -> None:
        self._env = env
        self._lock = threading.Lock()
        self._closed = False
        self._spool: Any = None
        self._ack_path: Path | None = None
        if env.run_dir is not None:
            run = RunDir(env.run_dir)
            spool_path = run.spool_file(env.rank)
            spool_path.parent.mkdir(parents=True, exist_ok=True)
            self._spool = spool_path.open("ab")  # binary: tell() is the byte offset
            self._ack_path = run.spool_ack_file(env.rank)
        self.spool_path: Path | None = Path(self._spool.name) if self._spool else None

        # (record, spool offset just after it; None without a spool)
        self._queue: queue.Queue[tuple[dict[str, Any], int | None] | dict] = queue.Queue()
        self._closing = threading.Event()  # no more records; drain and exit
        self._abort = threading.Event()  # close() timed out; give up now
        self._thread: threading.Thread | None = None
        if env.reporting_enabled:
            self._thread = threading.Thread(
                target=self._send_loop, name=f"torchyard-reporter-{env.rank}", daemon=True
            )
            self._thread.start()
        else:
            _warn_noop_once()

    @property
    def enabled(self) -> bool:
        """True when records are sent to the API (not just spooled)."""
        return self._thread is not None

    def report(self, *, epoch: int | None = None, step: int | None = None, **metrics: Any) -> None:
        """Record each ``name=value`` in ``metrics`` for this rank and attempt.

        Spools synchronously, sends asynchronously. Raises ``ValueError`` naming the field when
        a record is not one the server takes (nothing of the call is reported then),
        ``TypeError`` for a value that is not a number, ``RuntimeError`` after close.
        """
        now = time.time()
        records = [
            {
                "attempt": self._env.attempt,
                "rank": self._env.rank,
                "epoch": epoch,
                "step": step,
                "name": name,
                "value": encode_value(value),
                "time": now,
            }
            for name, value in metrics.items()
        ]
        for record in records:
            _check(record)
        with self._lock:
            if self._closed:
                raise RuntimeError("Reporter is closed")
            # Queued under the lock too: the queue keeps the spool's order, so an ack offset
            # never passes a record that was not answered.
            for record in records:
                offset = None
                if self._spool is not None:
                    self._spool.write((json.dumps(record, allow_nan=False) + "\n").encode())
                    offset = self._spool.tell()
                if self._thread is not None:
                    self._queue.put((record, offset))
            if self._spool is not None:
                self._spool.flush()

    def close(self, timeout_s: float = 10.0) -> None:
        """Send what is pending for at most ``timeout_s``, then stop. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._closing.set()
        if self._thread is not None:
            self._queue.put(_WAKE)  # the sender sees "closing" now, not a queue poll later
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                self._abort.set()
                log.warning(
                    "reporter: gave up after %.1fs with ~%d records unsent (they are in the spool)",
                    timeout_s,
                    self._queue.qsize(),
                )
        with self._lock:
            if self._spool is not None:
                self._spool.close()
                self._spool = None

    def _send_loop(self) -> None:
        env = self._env
        url = f"{env.api_url}/jobs/{env.job_id}/records"
        headers = {"Authorization": f"Bearer {env.job_token}"} if env.job_token else {}
        # Certificates are verified for an https API; a plain-http one (the server on this host,
        # the usual case) has none, and httpx's default context would load certifi's CA bundle
        # for nothing: ~40 ms of CPU in every rank.
        verify = url.startswith("https://")
        with httpx.Client(timeout=HTTP_TIMEOUT_S, headers=headers, verify=verify) as client:
            while not self._abort.is_set():
                try:
                    # Once closing, drain without waiting: the rank exits as soon as it is sent.
                    first = self._queue.get(block=not self._closing.is_set(), timeout=0.2)
                except queue.Empty:
                    first = _WAKE
                batch = [] if first is _WAKE else [first]
                while len(batch) < BATCH_MAX:
                    try:
                        item = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if item is not _WAKE:
                        batch.append(item)
                if batch:
                    if self._send_batch(client, url, [record for record, _ in batch]):
                        self._ack(batch[-1][1])
                elif self._closing.is_set():
                    return

    def _send_batch(self, client: httpx.Client, url: str, batch: list[dict[str, Any]]) -> bool:
        """Send until answered for good; True then, False when aborted first."""
        delay = BACKOFF_START_S
        while not self._abort.is_set():
            wait = delay
            try:
                response = client.post(url, json={"records": batch})
            except httpx.TransportError as exc:
                log.info("reporter: %s; retrying in %.1fs", exc, delay)
            else:
                code = response.status_code
                if code < 400:
                    return True
                if code < 500 and code != 429:
                    log.warning(
                        "reporter: API refused %d records (%d: %s); dropped (still in spool)",
                        len(batch),
                        code,
                        response.text[:200],
                    )
                    return True
                wait = max(delay, _retry_after_s(response))
                log.info("reporter: API answered %d; retrying in %.1fs", code, wait)
            self._abort.wait(wait)
            delay = min(delay * 2, BACKOFF_CAP_S)
        return False

    def _ack(self, offset: int | None) -> None:
        """Record that every record up to ``offset`` in the spool was answered (atomically)."""
        if offset is None or self._ack_path is None:
            return
        tmp = self._ack_path.with_name(self._ack_path.name + ".tmp")
        try:
            tmp.write_text(str(offset))
            os.replace(tmp, self._ack_path)
        except OSError as exc:  # the server then re-reads more of the spool: nothing is lost
            log.info("reporter: could not write %s: %s", self._ack_path, exc)


def _retry_after_s(response: httpx.Response) -> float:
    """The answer's ``Retry-After`` in seconds (0 when absent, or an HTTP date), capped."""
    try:
        seconds = float(response.headers.get("retry-after", "0"))
    except ValueError:
        return 0.0
    return min(max(seconds, 0.0), RETRY_AFTER_MAX_S) if seconds == seconds else 0.0


def _check(record: dict[str, Any]) -> None:
    """``ValueError`` naming the field when the server would refuse ``record``."""
    try:
        RecordPost.model_validate(record)
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        field = ".".join(str(p) for p in err["loc"]) or "record"
        shown = record["name"] if field == "name" else record.get(field)
        raise ValueError(
            f"worker.report: {field} {shown!r} is not accepted: {err['msg']} "
            f"(metric names: 1-64 characters of A-Z a-z 0-9 _ . : / -); nothing of this call "
            "was reported"
        ) from None


def _warn_noop_once() -> None:
    global _noop_warned
    with _noop_warned_lock:
        if _noop_warned:
            return
        _noop_warned = True
    log.warning(
        "not running as a torchyard job (TORCHYARD_API_URL/TORCHYARD_JOB_ID not set): "
        "metrics are not sent to torchyard (still spooled when TORCHYARD_RUN_DIR is set)"
    )
