"""sweep record: sweep_trials, a sweep's own record of each trial it made

Revision ID: 0015_sweep_record
Revises: 0014_ids_never_reused
Create Date: 2026-12-12 09:00:00

A sweep counted its trials, and took its counts and best, from its trials' jobs, so deleting a
finished trial's job made the sweep make another trial and dropped a deleted best (issue 44,
item 9). ``sweep_trials`` is the sweep's own record: one row per trial, made in the transaction
that makes the trial's job; its ``outcome``, ``value``, ``state`` and ``reason`` are copied from
the job before the job is deleted (service.domain.sweeps.manage, ``Sweeps.settle``). Existing
trials get their row here, numbered in the order they were made (their job ids); what a trial
deleted before this revision was is not known, so none is made up for it.
"""
import sqlalchemy as sa
from alembic import op

revision = "0015_sweep_record"
down_revision = "0014_ids_never_reused"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "sweep_trials",
        sa.Column("sweep_id", sa.Integer(), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("outcome", sa.String(length=16), nullable=True),
        sa.Column("value", sa.Float(), nullable=True),
        sa.Column("state", sa.String(length=16), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(["sweep_id"], ["sweeps.id"],
                                name=op.f("fk_sweep_trials_sweep_id_sweeps")),
        sa.PrimaryKeyConstraint("sweep_id", "number", name=op.f("pk_sweep_trials")),
    )
    op.execute(
        "INSERT INTO sweep_trials (sweep_id, number, job_id, params)"
        " SELECT sweep_id, ROW_NUMBER() OVER (PARTITION BY sweep_id ORDER BY id), id,"
        " COALESCE(params, '{}')"
        " FROM jobs WHERE sweep_id IS NOT NULL AND sweep_id IN (SELECT id FROM sweeps)"
    )


def downgrade() -> None:
    op.drop_table("sweep_trials")
