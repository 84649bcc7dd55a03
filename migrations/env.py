"""Alembic environment: runs migrations online against the configured URL."""

from alembic import context
from sqlalchemy import Connection

from service.store.db import make_engine
from service.store.tables import Base

config = context.config
target_metadata = Base.metadata


def _sqlite_foreign_keys(connection: Connection, on: bool) -> None:
    """SQLite's batch migrations rebuild a table (copy, DROP, rename). With foreign keys on, the
    DROP cascades into every child row (a job's records, labels, allocations): the rebuild must
    run with them off. The pragma is ignored inside a transaction, so it goes to the driver's
    connection directly, which is in autocommit mode (``service.store.db`` sets ``isolation_level``)."""
    connection.connection.driver_connection.execute(f"PRAGMA foreign_keys={'ON' if on else 'OFF'}")


def _check_foreign_keys(connection: Connection) -> None:
    broken = connection.exec_driver_sql("PRAGMA foreign_key_check").all()
    if broken:
        raise RuntimeError(f"migration left rows that break foreign keys: {broken[:5]}")


def run_migrations_online() -> None:
    engine = make_engine(config.get_main_option("sqlalchemy.url"))
    sqlite = engine.dialect.name == "sqlite"
    with engine.connect() as connection:
        if sqlite:
            _sqlite_foreign_keys(connection, on=False)
        context.configure(
            connection=connection, target_metadata=target_metadata, render_as_batch=True
        )
        with context.begin_transaction():
            context.run_migrations()
            if sqlite:
                _check_foreign_keys(connection)
        if sqlite:
            _sqlite_foreign_keys(connection, on=True)
    engine.dispose()


run_migrations_online()
