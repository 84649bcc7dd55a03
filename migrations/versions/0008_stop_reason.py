"""jobs.stop_reason: why a loss guard wants a job stopped

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-03 09:00:00

Set once (compare-and-set) by the process that ingested the offending record; the supervisor
fails the job with it (service.guard). ``recreate="never"``: added and dropped in place, never a
table rebuild (that would cascade into every child row; see 0005).
"""
import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None, recreate="never") as batch_op:
        batch_op.add_column(sa.Column("stop_reason", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None, recreate="never") as batch_op:
        batch_op.drop_column("stop_reason")
