"""The declarative base every table shares, with the constraint naming Alembic's migrations use."""

from sqlalchemy import BigInteger, Integer, MetaData
from sqlalchemy.orm import DeclarativeBase

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


# 64-bit on PostgreSQL; SQLite's INTEGER is 64-bit already (and only ``INTEGER PRIMARY KEY``,
# not BIGINT, is SQLite's rowid that AUTOINCREMENT needs).
Int64 = BigInteger().with_variant(Integer, "sqlite")
