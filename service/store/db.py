"""Engine and session factories, schema migration through Alembic, and which database errors a
retry can clear.

Two engines on one SQLite file: the writer (every transaction ``BEGIN IMMEDIATE``, one at a time
per process) and a reader for GET routes (plain deferred ``BEGIN``, ``query_only``), so polling
never queues behind writes: in WAL mode readers see the last commit and never wait for a writer.

**Lock waits are bounded** (``lock_timeout_s``; the server's is ``TORCHYARD_DB_LOCK_TIMEOUT_S``):
a transaction that cannot get a lock in time fails with an ``OperationalError`` that
``is_busy`` recognises (the API answers it 503 with ``Retry-After``) instead of waiting for as
long as the holder takes, which is forever when the holder is a paused process. On SQLite that
is the write lock: this process's writers queue for their turn and then for SQLite's, together
at most ``lock_timeout_s``. On PostgreSQL, ``lock_timeout`` (row locks, a job's record lock),
and a transaction left idle ``IDLE_IN_TRANSACTION_FACTOR`` times as long is ended by the server,
so a paused holder's locks are freed. Sessions of an engine from ``with_lock_timeout`` wait
less: the supervisor's loop never waits long behind a request (docs/operations.md).
"""

import re
import sqlite3
import sys
import threading
import time
from pathlib import Path

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from service.store.changefeed import ChangeFeed, attach

# Engines built without a timeout (migrations, tools): nothing answers a client while they wait.
TOOL_LOCK_TIMEOUT_S = 30.0
# PostgreSQL ends a writer's transaction that sits idle this many lock timeouts: longer than
# any lock wait, so a waiter gives up (503) before a paused holder is cut off.
IDLE_IN_TRANSACTION_FACTOR = 3
# Execution option naming a shorter lock wait for one engine's transactions (``with_lock_timeout``).
LOCK_TIMEOUT_OPTION = "torchyard_lock_timeout_s"
# Connections kept open: one per thread of Starlette's pool (40), so a reader rarely reopens one.
POOL_SIZE = 40
# Never make a request wait for a connection: a session dependency keeps its connection until
# its exit runs in the thread pool, so with more requests in flight than connections every
# pool thread can sit in checkout while the exits that would free one wait for a thread (seen
# with 200 pollers: every request stalled for the 30 s checkout timeout). Extra connections are
# opened on demand and closed on return.
POOL_OVERFLOW = -1
# PostgreSQL: connections kept open per engine (each is a server process; more open on demand).
SERVER_POOL_SIZE = 10
_HOLDS_WRITE_LOCK = "torchyard_holds_write_lock"
_BUSY_TIMEOUT_MS = "torchyard_busy_timeout_ms"
# SQLite's primary result codes for "another connection holds the lock".
_SQLITE_BUSY, _SQLITE_LOCKED = 5, 6
# PostgreSQL SQLSTATEs a retry can clear: lock_not_available (lock_timeout), query_canceled
# (statement_timeout), serialization_failure, deadlock_detected, idle_in_transaction_session_
# timeout, admin_shutdown, crash_shutdown, cannot_connect_now; and class 08 (connection lost).
_PG_RETRYABLE = frozenset({"55P03", "57014", "40001", "40P01", "25P03", "57P01", "57P02", "57P03"})


def make_engine(
    url: str, *, readonly: bool = False, lock_timeout_s: float = TOOL_LOCK_TIMEOUT_S
) -> Engine:
    """An engine; for SQLite: WAL, foreign keys on, a busy timeout of ``lock_timeout_s``.

    ``readonly``: for GET routes. Transactions start deferred and ``PRAGMA query_only`` makes an
    accidental write fail loudly instead of upgrading a read lock under load.
    """
    if not url.startswith("sqlite"):
        return _server_engine(url, readonly=readonly, lock_timeout_s=lock_timeout_s)
    if url.startswith("sqlite:///") and not url.startswith("sqlite:///:memory:"):
        Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    busy_ms = _ms(lock_timeout_s)
    engine = create_engine(
        url,
        connect_args={"check_same_thread": False, "timeout": lock_timeout_s},
        pool_size=POOL_SIZE,
        max_overflow=POOL_OVERFLOW,
    )

    @event.listens_for(engine, "connect")
    def _sqlite_pragmas(dbapi_conn, record) -> None:  # type: ignore[no-untyped-def]
        # Let SQLAlchemy, not pysqlite, decide when transactions begin (BEGIN below).
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute(f"PRAGMA busy_timeout={busy_ms}")
        cur.execute("PRAGMA synchronous=NORMAL")
        if readonly:
            cur.execute("PRAGMA query_only=ON")
        cur.close()
        record.info[_BUSY_TIMEOUT_MS] = busy_ms

    if readonly:

        @event.listens_for(engine, "begin")
        def _begin_deferred(conn) -> None:  # type: ignore[no-untyped-def]
            conn.exec_driver_sql("BEGIN")

        return engine

    _serialize_writers(engine, lock_timeout_s)
    return engine


def with_lock_timeout(engine: Engine, seconds: float) -> Engine:
    """``engine`` (same pool, same events) whose transactions wait at most ``seconds`` for a
    lock: for the supervisor's own writes, which retry on their next pass rather than wait."""
    return engine.execution_options(**{LOCK_TIMEOUT_OPTION: seconds})


def is_busy(exc: BaseException) -> bool:
    """True for a database error that a later retry can clear: a lock not granted in time (held
    by another process or a paused one), a transaction the server ended, a lost connection.
    False for everything else (a bug, a constraint): those are not retried. Takes SQLAlchemy's
    errors and the drivers' own (raised where the hot paths use the driver directly)."""
    if isinstance(exc, DBAPIError):
        if exc.connection_invalidated:
            return True
        exc = exc.orig
    if isinstance(exc, sqlite3.OperationalError):
        code = getattr(exc, "sqlite_errorcode", None)
        if code is not None:
            return code & 0xFF in (_SQLITE_BUSY, _SQLITE_LOCKED)
        return "locked" in str(exc)
    psycopg = sys.modules.get("psycopg")  # imported by the engine when the store is PostgreSQL
    if psycopg is None or not isinstance(exc, psycopg.Error):
        return False
    if exc.sqlstate is None:  # the driver's own: the connection is gone or unusable
        return isinstance(exc, psycopg.OperationalError)
    return exc.sqlstate in _PG_RETRYABLE or exc.sqlstate.startswith("08")


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


def _lock_timeout(conn: Connection, default_s: float) -> float:
    return float(conn.get_execution_options().get(LOCK_TIMEOUT_OPTION, default_s))


def _locked(waited_s: float) -> OperationalError:
    """What SQLite itself raises when its busy timeout runs out, so callers see one error."""
    return OperationalError(
        "BEGIN IMMEDIATE", None,
        sqlite3.OperationalError(f"database is locked (waited {waited_s:.1f}s for a turn "
                                 "among this process's writers)"),
    )


def _serialize_writers(engine: Engine, lock_timeout_s: float) -> None:
    """Every transaction is ``BEGIN IMMEDIATE``, and this process's writers take turns on a lock.

    IMMEDIATE takes the write lock up front, so two writers never deadlock upgrading a read lock
    (the usual source of "database is locked" despite busy_timeout). The in-process lock hands
    the turn straight to the next waiting thread; SQLite's busy handler would instead poll with
    sleeps of up to 100 ms, which idled the server under concurrent batch writers. Other
    processes (a second server, the CLI) are still excluded by SQLite itself.

    A transaction waits at most its lock timeout for both together: the time spent waiting for
    the turn is taken off SQLite's busy timeout for ``BEGIN IMMEDIATE`` (set per connection only
    when it changes). Either wait running out raises "database is locked" (``is_busy``).
    """
    lock = threading.Lock()

    def _release(info: dict) -> None:  # type: ignore[type-arg]
        if info.pop(_HOLDS_WRITE_LOCK, False):
            lock.release()

    @event.listens_for(engine, "begin")
    def _begin_immediate(conn) -> None:  # type: ignore[no-untyped-def]
        timeout_s = _lock_timeout(conn, lock_timeout_s)
        started = time.monotonic()
        # A thread that nests a second writer session inside an open one waits here for the
        # timeout and fails, as any other wait for the lock does, never hangs.
        if not lock.acquire(timeout=timeout_s):
            raise _locked(time.monotonic() - started)
        conn.info[_HOLDS_WRITE_LOCK] = True
        try:
            waited_s = time.monotonic() - started
            busy_ms = _ms(timeout_s - waited_s) if waited_s > 0.01 else _ms(timeout_s)
            if conn.info.get(_BUSY_TIMEOUT_MS) != busy_ms:  # the DBAPI connection's, kept
                conn.connection.driver_connection.execute(f"PRAGMA busy_timeout={busy_ms}")
                conn.info[_BUSY_TIMEOUT_MS] = busy_ms
            conn.exec_driver_sql("BEGIN IMMEDIATE")
        except BaseException:
            _release(conn.info)
            raise

    @event.listens_for(engine, "commit")
    @event.listens_for(engine, "rollback")
    def _end(conn) -> None:  # type: ignore[no-untyped-def]
        _release(conn.info)

    # Safety net: a connection going back to the pool, or dropped, never keeps the turn.
    @event.listens_for(engine, "checkin")
    @event.listens_for(engine, "invalidate")
    def _returned(_dbapi_conn, record, *_args) -> None:  # type: ignore[no-untyped-def]
        if record is not None:
            _release(record.info)


def _server_engine(url: str, *, readonly: bool, lock_timeout_s: float) -> Engine:
    """A client/server database (PostgreSQL): no writer lock, the server orders writers itself.

    READ COMMITTED (PostgreSQL's default) is what the compare-and-set transitions need: an
    ``UPDATE … WHERE state IN (…)`` that waited on a concurrent one re-reads the row and matches
    nothing if the other won. The reader runs each statement on its own (autocommit: the same
    reads as READ COMMITTED, without a transaction's round trips); its connections are
    read-only for their whole life (``default_transaction_read_only``), so a stray write fails
    (a guard against mistakes, not a security boundary); set once per new connection rather
    than by a ``SET TRANSACTION`` round trip per request, and without touching the
    ``options`` a URL may carry.

    The writer's connections get ``lock_timeout`` and ``idle_in_transaction_session_timeout``
    the same way (see the module docstring); a transaction of a ``with_lock_timeout`` engine
    sets its own ``lock_timeout`` first (``SET LOCAL``, one statement).
    """
    engine = create_engine(
        url,
        pool_pre_ping=True,
        # Each connection is a server process: keep fewer idle than SQLite's, never wait for one.
        pool_size=SERVER_POOL_SIZE,
        max_overflow=POOL_OVERFLOW,
        # The reader in autocommit: under READ COMMITTED each statement reads the latest commit
        # anyway, so a read transaction bought nothing but its BEGIN and ROLLBACK round trips
        # (two of a metrics poll's four; docs/benchmarks.md §7).
        isolation_level="AUTOCOMMIT" if readonly else "READ COMMITTED",
    )
    if readonly:

        @event.listens_for(engine, "connect")
        def _read_only(dbapi_conn, _record) -> None:  # type: ignore[no-untyped-def]
            autocommit = dbapi_conn.autocommit
            dbapi_conn.autocommit = True  # a session setting, not one transaction's
            dbapi_conn.execute("SET default_transaction_read_only = on")
            dbapi_conn.autocommit = autocommit

        return engine

    lock_ms, idle_ms = _ms(lock_timeout_s), _ms(lock_timeout_s * IDLE_IN_TRANSACTION_FACTOR)

    @event.listens_for(engine, "connect")
    def _timeouts(dbapi_conn, _record) -> None:  # type: ignore[no-untyped-def]
        autocommit = dbapi_conn.autocommit
        dbapi_conn.autocommit = True  # session settings, not one transaction's
        dbapi_conn.execute(f"SET lock_timeout = {lock_ms}")
        dbapi_conn.execute(f"SET idle_in_transaction_session_timeout = {idle_ms}")
        dbapi_conn.autocommit = autocommit

    @event.listens_for(engine, "begin")
    def _shorter_wait(conn) -> None:  # type: ignore[no-untyped-def]
        timeout_s = conn.get_execution_options().get(LOCK_TIMEOUT_OPTION)
        if timeout_s is not None:
            conn.exec_driver_sql(f"SET LOCAL lock_timeout = {_ms(timeout_s)}")

    return engine


def make_session_factory(
    engine: Engine, feed: ChangeFeed | None = None
) -> sessionmaker[Session]:
    """Sessions; with ``feed``, their commits tell waiting routes which jobs changed."""
    factory = sessionmaker(engine, expire_on_commit=False)
    if feed is not None:
        attach(factory, feed)
    return factory


def alembic_config(url: str):  # type: ignore[no-untyped-def]
    from alembic.config import Config

    import migrations

    cfg = Config()
    cfg.set_main_option("script_location", str(Path(migrations.__file__).parent))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def head_revision() -> str:
    """The newest migration's revision, read from the file names alone: the files in
    ``migrations/versions`` sort in the order they apply and the newest is named by its
    revision (tests/store/test_migrations.py holds every revision to this)."""
    import migrations

    versions = Path(migrations.__file__).parent / "versions"
    return max(path.stem for path in versions.glob("[0-9]*.py"))


def is_at_head(url: str) -> bool:
    """True when the database at ``url`` records exactly the newest revision; False for any
    other, none, or no database (then only Alembic can tell what to do)."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            found = conn.exec_driver_sql("SELECT version_num FROM alembic_version").scalars().all()
    except DBAPIError:  # no table yet (a new database) or none reachable
        return False
    finally:
        engine.dispose()
    return found == [head_revision()]


def upgrade(url: str, revision: str = "head") -> None:
    """Create or upgrade the schema; the only way the schema is ever made. A database already
    at the head is left alone without loading Alembic: every server start (and each
    ``--workers`` process) calls this, and Alembic's imports and environment were ~0.24 CPU s
    of a start that had nothing to migrate."""
    if url.startswith("sqlite:///"):
        Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    if revision == "head" and is_at_head(url):
        return
    from alembic import command

    command.upgrade(alembic_config(url), revision)


# URLs as they may be printed or logged: without the password a database URL (or any URL with
# ``user:password@``) carries.
MASK = "***"
# user:password@ after the scheme's //, for what SQLAlchemy cannot parse.
_USERINFO = re.compile(r"(//[^/?#@:]*:)[^/?#@]*@")


def masked_url(url: str) -> str:
    """``url`` with its password replaced by ``***`` (``postgresql+psycopg://u:***@db/x``);
    a URL without one is unchanged."""
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        return _USERINFO.sub(rf"\g<1>{MASK}@", url)
    return parsed.render_as_string(hide_password=True) if parsed.password else url
