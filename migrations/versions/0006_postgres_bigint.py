"""64-bit record seq and step on PostgreSQL (SQLite's INTEGER is 64-bit already)

A step may be up to 2**62 (``service.schemas``) and ``seq`` counts every record ever stored;
PostgreSQL's ``integer`` (and the ``serial`` sequence behind ``seq``) stop at 2**31 - 1.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-03 08:40:00
"""
import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.alter_column("metric_records", "seq", type_=sa.BigInteger(), existing_nullable=False)
    op.alter_column("metric_records", "step", type_=sa.BigInteger(), existing_nullable=False)
    op.execute("ALTER SEQUENCE metric_records_seq_seq AS bigint")


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute("ALTER SEQUENCE metric_records_seq_seq AS integer")
    op.alter_column("metric_records", "step", type_=sa.Integer(), existing_nullable=False)
    op.alter_column("metric_records", "seq", type_=sa.Integer(), existing_nullable=False)
