"""retry elsewhere: jobs.exclude_nodes, the Slurm nodes a job leaves out from now on

Revision ID: 0013_exclude_nodes
Revises: 0012_pause
Create Date: 2026-12-05 07:00:00

A ``retry_elsewhere`` rule on Slurm ends the job's allocation and queues the job again
(docs/lifecycle.md, "Retry rules"); its next allocations are submitted with ``--exclude`` naming
every node one of its ranks failed on so far. ``exclude_nodes`` is that list (JSON, in the order
they were excluded); null = none, which every existing job gets. Added in place
(``recreate="never"``, see 0005).
"""
import sqlalchemy as sa
from alembic import op

revision = "0013_exclude_nodes"
down_revision = "0012_pause"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None, recreate="never") as batch_op:
        batch_op.add_column(sa.Column("exclude_nodes", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None, recreate="never") as batch_op:
        batch_op.drop_column("exclude_nodes")
