"""queue snapshot: the supervisor's last scheduling result, for every server process

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-03 13:30:00

One row the lease holder rewrites (fenced) whenever a scheduling pass's result changed; the
processes that do not supervise answer queue positions from it (service.queuesnapshot).
"""
import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    snapshot = op.create_table(
        "queue_snapshot",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("version", sa.Integer(), server_default="0", nullable=False),
        sa.Column("waiting", sa.Text(), server_default="{}", nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_queue_snapshot")),
    )
    # The one row: empty until a supervisor's first scheduling pass.
    op.bulk_insert(snapshot, [{"id": 1, "version": 0, "waiting": "{}"}])


def downgrade() -> None:
    op.drop_table("queue_snapshot")
