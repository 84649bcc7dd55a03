"""sweeps: many trials of one spec; a trial is a job carrying its sweep and its parameters

Revision ID: 0011_sweeps
Revises: 0009
Create Date: 2026-12-10 10:00:00

``sweeps`` holds each sweep's request as submitted (``spec``) and its state; the search itself
is rebuilt in memory from these rows and the trials' records by whichever supervisor holds the
lease (service.domain.sweeps.driver). ``jobs.sweep_id`` and ``jobs.params`` make a job a trial;
``jobs.pruned_epoch`` marks a trial the sweep's early-stopping rule stopped (its state is then
``cancelled``, its outcome ``pruned``). The jobs columns are added in place (``recreate="never"``,
see 0005 and 0008). Another branch adds 0010; the merge rechains this one after it.
"""
import sqlalchemy as sa
from alembic import op

revision = "0011_sweeps"
down_revision = "0010_webhooks"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "sweeps",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("priority", sa.Integer(), server_default="0", nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("ended_at", sa.DateTime(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_sweeps")),
    )
    op.create_index(op.f("ix_sweeps_state"), "sweeps", ["state"], unique=False)
    with op.batch_alter_table("jobs", schema=None, recreate="never") as batch_op:
        batch_op.add_column(sa.Column("sweep_id", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("params", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("pruned_epoch", sa.Integer(), nullable=True))
    op.create_index(op.f("ix_jobs_sweep_id"), "jobs", ["sweep_id"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_jobs_sweep_id"), table_name="jobs")
    with op.batch_alter_table("jobs", schema=None, recreate="never") as batch_op:
        batch_op.drop_column("pruned_epoch")
        batch_op.drop_column("params")
        batch_op.drop_column("sweep_id")
    op.drop_index(op.f("ix_sweeps_state"), table_name="sweeps")
    op.drop_table("sweeps")
