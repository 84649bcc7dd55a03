"""fair share: teams' quota, share, max_priority, Slurm account and QOS; the slot usage table

Revision ID: 0018_fair_share
Revises: 0017_tracking_outbox
Create Date: 2026-12-14 10:00:00

Fair shares (docs/scheduling.md, "Teams: quotas, fair share and budgets"). ``teams`` gains
``quota`` (JSON ``{"max_slots", "slot_hours", "period"}``, null = unlimited), ``share`` (the
fair-share weight, 1), ``max_priority`` (the highest priority its members may submit, 50),
``slurm_account`` and ``slurm_qos`` (passed to ``sbatch``). Existing teams get the defaults.

``slot_usage`` is the account of who used what: one row each time a job starts holding slots
(``started_at``) until it frees them (``ended_at``; null while it holds them), as seconds since
the epoch on the clock of the server that wrote it. Team and owner are copied from the job, so
the account outlives the job (no foreign key: jobs are deleted, usage is not). Ids are never
reused. Added in place (``recreate="never"``, see 0005).
"""
import sqlalchemy as sa
from alembic import op

revision = "0018_fair_share"
down_revision = "0017_tracking_outbox"
branch_labels = None
depends_on = None

Int64 = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    with op.batch_alter_table("teams", schema=None, recreate="never") as batch_op:
        batch_op.add_column(sa.Column("quota", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("share", sa.Float(), server_default="1", nullable=False))
        batch_op.add_column(
            sa.Column("max_priority", sa.Integer(), server_default="50", nullable=False))
        batch_op.add_column(sa.Column("slurm_account", sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column("slurm_qos", sa.String(length=64), nullable=True))
    op.create_table(
        "slot_usage",
        sa.Column("id", Int64, autoincrement=True, nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("team", sa.String(length=64), nullable=True),
        sa.Column("owner", sa.String(length=64), nullable=True),
        sa.Column("slots", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.Float(), nullable=False),
        sa.Column("ended_at", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_slot_usage")),
        sqlite_autoincrement=True,
    )
    op.create_index(op.f("ix_slot_usage_job_id"), "slot_usage", ["job_id"], unique=False)
    op.create_index(op.f("ix_slot_usage_ended_at"), "slot_usage", ["ended_at"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_slot_usage_ended_at"), table_name="slot_usage")
    op.drop_index(op.f("ix_slot_usage_job_id"), table_name="slot_usage")
    op.drop_table("slot_usage")
    with op.batch_alter_table("teams", schema=None, recreate="never") as batch_op:
        for column in ("slurm_qos", "slurm_account", "max_priority", "share", "quota"):
            batch_op.drop_column(column)
