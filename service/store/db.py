"""Engine and session factories, and schema migration through Alembic.

Two engines on one SQLite file: the writer (every transaction ``BEGIN IMMEDIATE``, one at a time
per process) and a reader for GET routes (plain deferred ``BEGIN``, ``query_only``), so polling
never queues behind writes: in WAL mode readers see the last commit and never wait for a writer.
"""

import threading
from pathlib import Path

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

from service.store.changefeed import ChangeFeed, attach

SQLITE_BUSY_TIMEOUT_MS = 30_000
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


def make_engine(url: str, *, readonly: bool = False) -> Engine:
    """An engine; for SQLite: WAL, foreign keys on, a busy timeout (writers queue, not fail).

    ``readonly``: for GET routes. Transactions start deferred and ``PRAGMA query_only`` makes an
    accidental write fail loudly instead of upgrading a read lock under load.
    """
    if not url.startswith("sqlite"):
        return _server_engine(url, readonly=readonly)
    if url.startswith("sqlite:///") and not url.startswith("sqlite:///:memory:"):
        Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(
        url,
        connect_args={"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_MS / 1000},
        pool_size=POOL_SIZE,
        max_overflow=POOL_OVERFLOW,
    )

    @event.listens_for(engine, "connect")
    def _sqlite_pragmas(dbapi_conn, _record) -> None:  # type: ignore[no-untyped-def]
        # Let SQLAlchemy, not pysqlite, decide when transactions begin (BEGIN below).
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cur.execute("PRAGMA synchronous=NORMAL")
        if readonly:
            cur.execute("PRAGMA query_only=ON")
        cur.close()

    if readonly:

        @event.listens_for(engine, "begin")
        def _begin_deferred(conn) -> None:  # type: ignore[no-untyped-def]
            conn.exec_driver_sql("BEGIN")

        return engine

    _serialize_writers(engine)
    return engine


def _serialize_writers(engine: Engine) -> None:
    """Every transaction is ``BEGIN IMMEDIATE``, and this process's writers take turns on a lock.

    IMMEDIATE takes the write lock up front, so two writers never deadlock upgrading a read lock
    (the usual source of "database is locked" despite busy_timeout). The in-process lock hands
    the turn straight to the next waiting thread; SQLite's busy handler would instead poll with
    sleeps of up to 100 ms, which idled the server under concurrent batch writers. Other
    processes (a second server, the CLI) are still excluded by SQLite itself.
    """
    lock = threading.Lock()

    def _release(info: dict) -> None:  # type: ignore[type-arg]
        if info.pop(_HOLDS_WRITE_LOCK, False):
            lock.release()

    @event.listens_for(engine, "begin")
    def _begin_immediate(conn) -> None:  # type: ignore[no-untyped-def]
        # Bounded like SQLite's own wait: a thread that nests a second writer session inside an
        # open one waits this long and then meets SQLite's busy timeout, as before, not a hang.
        if lock.acquire(timeout=SQLITE_BUSY_TIMEOUT_MS / 1000):
            conn.info[_HOLDS_WRITE_LOCK] = True
        try:
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


def _server_engine(url: str, *, readonly: bool) -> Engine:
    """A client/server database (PostgreSQL): no writer lock, the server orders writers itself.

    READ COMMITTED (PostgreSQL's default) is what the compare-and-set transitions need: an
    ``UPDATE … WHERE state IN (…)`` that waited on a concurrent one re-reads the row and matches
    nothing if the other won. The reader's connections are read-only for their whole life
    (``default_transaction_read_only``), so a stray write fails (a guard against mistakes, not
    a security boundary); set once per new connection rather than by a ``SET TRANSACTION``
    round trip per request, and without touching the ``options`` a URL may carry.
    """
    engine = create_engine(
        url,
        pool_pre_ping=True,
        # Each connection is a server process: keep fewer idle than SQLite's, never wait for one.
        pool_size=SERVER_POOL_SIZE,
        max_overflow=POOL_OVERFLOW,
        isolation_level="READ COMMITTED",
    )
    if readonly:

        @event.listens_for(engine, "connect")
        def _read_only(dbapi_conn, _record) -> None:  # type: ignore[no-untyped-def]
            autocommit = dbapi_conn.autocommit
            dbapi_conn.autocommit = True  # a session setting, not one transaction's
            dbapi_conn.execute("SET default_transaction_read_only = on")
            dbapi_conn.autocommit = autocommit

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


def upgrade(url: str, revision: str = "head") -> None:
    """Create or upgrade the schema; the only way the schema is ever made."""
    from alembic import command

    if url.startswith("sqlite:///"):
        Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    command.upgrade(alembic_config(url), revision)
