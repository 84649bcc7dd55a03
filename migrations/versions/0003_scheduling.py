"""scheduling: priority, labels, idempotency keys, phase times

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02 13:50:00
"""
import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("priority", sa.Integer(), server_default="0", nullable=False))
        batch_op.add_column(sa.Column("idempotency_key", sa.String(length=200), nullable=True))
        batch_op.add_column(sa.Column("first_metric_at", sa.DateTime(), nullable=True))
        batch_op.create_unique_constraint(
            batch_op.f("uq_jobs_idempotency_key"), ["idempotency_key"]
        )
        batch_op.create_index("ix_jobs_queue", ["state", "priority", "id"], unique=False)

    op.create_table(
        "job_labels",
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("key", sa.String(length=63), nullable=False),
        sa.Column("value", sa.String(length=200), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_job_labels_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("job_id", "key", name=op.f("pk_job_labels")),
    )
    with op.batch_alter_table("job_labels", schema=None) as batch_op:
        batch_op.create_index("ix_job_labels_key_value", ["key", "value"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("job_labels", schema=None) as batch_op:
        batch_op.drop_index("ix_job_labels_key_value")
    op.drop_table("job_labels")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index("ix_jobs_queue")
        batch_op.drop_constraint(batch_op.f("uq_jobs_idempotency_key"), type_="unique")
        batch_op.drop_column("first_metric_at")
        batch_op.drop_column("idempotency_key")
        batch_op.drop_column("priority")
