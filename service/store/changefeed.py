"""Told, not polling: which jobs changed, delivered to the routes waiting on them.

Repository functions that change a job or add its records note the job id on their session
(``note_change``). When that session commits:

* on PostgreSQL the same transaction sends ``NOTIFY torchyard_jobs, '<id>'`` (delivered only if
  it commits), and every server process sharing the database — other ``--workers``, a standby on
  another host — hears it on a ``LISTEN`` connection (``PgListener``);
* on SQLite the writing process tells its own waiters at once. Other processes have no channel:
  their waiters fall back to a short poll (the caller's ``timeout``).

``ChangeFeed.version(job)`` + ``ChangeFeed.wait(job, seen, timeout)`` close the race between a
read and a notification: read the version, read the database, then wait only if nothing
changed since that version.
"""

import asyncio
import logging
import threading
from collections.abc import Iterable

from sqlalchemy import event
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, sessionmaker

logger = logging.getLogger(__name__)

CHANNEL = "torchyard_jobs"
_CHANGED = "torchyard_changed_jobs"
_NOTIFY = "SELECT pg_notify(%s, %s)"
LISTEN_RETRY_S = 1.0
# With LISTEN every commit is heard; a waiter still re-reads this often in case the listening
# connection dropped (notifications sent while it reconnects are lost).
LISTENING_FALLBACK_S = 2.0


def note_change(session: Session, job_id: int) -> None:
    """Mark ``job_id`` as changed by this session's transaction (told when it commits)."""
    session.info.setdefault(_CHANGED, set()).add(job_id)


class ChangeFeed:
    """Per-process: a version counter per job and the futures of the coroutines waiting on it.

    ``publish`` may be called from any thread; ``wait`` runs on the event loop.
    """

    def __init__(self) -> None:
        self.listening = False  # True once a PgListener hears every process's commits
        self._lock = threading.Lock()
        self._versions: dict[int, int] = {}
        self._waiters: dict[int, set[asyncio.Future[None]]] = {}

    def fallback_s(self, poll_s: float) -> float:
        """How long a waiter may sleep without being told: ``poll_s`` (the route's poll, for
        writers in other processes on SQLite) unless every commit is heard."""
        return max(poll_s, LISTENING_FALLBACK_S) if self.listening else poll_s

    def version(self, job_id: int) -> int:
        return self._versions.get(job_id, 0)

    def waiting(self, job_id: int) -> int:
        """How many waiters wait on ``job_id`` now (long polls and streams in their wait)."""
        with self._lock:
            return len(self._waiters.get(job_id, ()))

    def publish(self, job_ids: Iterable[int]) -> None:
        with self._lock:
            woken = []
            for job_id in job_ids:
                self._versions[job_id] = self._versions.get(job_id, 0) + 1
                woken.extend(self._waiters.pop(job_id, ()))
        for future in woken:
            future.get_loop().call_soon_threadsafe(_resolve, future)

    async def wait(self, job_id: int, seen: int, timeout: float) -> bool:
        """Until ``job_id`` changes after version ``seen``, at most ``timeout`` s; True if it did."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        with self._lock:
            if self._versions.get(job_id, 0) != seen:
                return True
            self._waiters.setdefault(job_id, set()).add(future)
        try:
            await asyncio.wait_for(future, timeout)
            return True
        except TimeoutError:
            return False
        finally:
            with self._lock:
                waiting = self._waiters.get(job_id)
                if waiting is not None:
                    waiting.discard(future)
                    if not waiting:
                        del self._waiters[job_id]


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def attach(factory: sessionmaker[Session], feed: ChangeFeed) -> None:
    """Make sessions of ``factory`` tell ``feed`` (and, on PostgreSQL, every listener) about the
    jobs they changed, once they commit."""

    @event.listens_for(factory, "before_commit")
    def _notify_in_transaction(session: Session) -> None:
        changed = session.info.get(_CHANGED)
        if changed and session.get_bind().dialect.name == "postgresql":
            # On the driver's connection of the session's transaction: SQLAlchemy's execution
            # path cost more than the statement (a record batch commits one per job).
            # The driver's errors are raised as SQLAlchemy's, as for every other statement.
            import psycopg

            raw = session.connection().connection.driver_connection
            try:
                with raw.cursor() as cur:
                    for job_id in sorted(changed):
                        cur.execute(_NOTIFY, (CHANNEL, str(job_id)))
            except psycopg.Error as exc:
                raise DBAPIError.instance(_NOTIFY, None, exc, psycopg.Error) from exc

    @event.listens_for(factory, "after_commit")
    def _tell_this_process(session: Session) -> None:
        changed = session.info.pop(_CHANGED, None)
        if changed:
            feed.publish(changed)

    @event.listens_for(factory, "after_rollback")
    def _forget(session: Session) -> None:
        session.info.pop(_CHANGED, None)


class PgListener:
    """A thread with its own connection ``LISTEN``ing on ``CHANNEL``; reconnects on failure."""

    def __init__(self, url: str, feed: ChangeFeed) -> None:
        self._conninfo = _libpq_url(url)
        self._feed = feed
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="torchyard-listen", daemon=True)
        self._conn = None

    def start(self) -> None:
        self._feed.listening = True
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        import psycopg

        while not self._stop.is_set():
            try:
                with psycopg.connect(self._conninfo, autocommit=True) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    while not self._stop.is_set():
                        # Bounded waits, so stop() is noticed.
                        for note in conn.notifies(timeout=0.5):
                            if note.payload.isdigit():
                                self._feed.publish([int(note.payload)])
            except Exception:
                if self._stop.is_set():
                    return
                logger.warning("listen: connection lost; retrying", exc_info=True)
                self._stop.wait(LISTEN_RETRY_S)


def _libpq_url(url: str) -> str:
    """``postgresql+psycopg://…`` → the ``postgresql://…`` libpq takes."""
    from sqlalchemy.engine import make_url

    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
