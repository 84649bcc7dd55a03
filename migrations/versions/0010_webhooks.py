"""webhooks: jobs.webhooks (subscriptions fixed at submit) and the webhook_deliveries outbox

Revision ID: 0010_webhooks
Revises: 0009
Create Date: 2026-12-10 10:00:00

A delivery row is written in the transaction of the state change it tells of; the supervisor
sends and retries it (service.domain.webhooks.delivery). ``recreate="never"`` on jobs: the column is added
and dropped in place, never a table rebuild (that would cascade into every child row; see 0005).
"""
import sqlalchemy as sa
from alembic import op

revision = "0010_webhooks"
down_revision = "0009"
branch_labels = None
depends_on = None

Int64 = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None, recreate="never") as batch_op:
        batch_op.add_column(sa.Column("webhooks", sa.JSON(), nullable=True))
    op.create_table(
        "webhook_deliveries",
        sa.Column("id", Int64, autoincrement=True, nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("endpoint", sa.String(length=64), nullable=False),
        sa.Column("event", sa.String(length=16), nullable=False),
        sa.Column("webhook_id", sa.String(length=64), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("state", sa.String(length=12), server_default="pending", nullable=False),
        sa.Column("attempts", sa.Integer(), server_default="0", nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(), nullable=False),
        sa.Column("last_attempt_at", sa.DateTime(), nullable=True),
        sa.Column("last_status_code", sa.Integer(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("delivered_at", sa.DateTime(), nullable=True),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"],
            name=op.f("fk_webhook_deliveries_job_id_jobs"), ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_webhook_deliveries")),
        sa.UniqueConstraint("webhook_id", name=op.f("uq_webhook_deliveries_webhook_id")),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_webhook_deliveries_due", "webhook_deliveries",
                    ["state", "next_attempt_at"], unique=False)
    op.create_index(op.f("ix_webhook_deliveries_job_id"), "webhook_deliveries", ["job_id"],
                    unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_webhook_deliveries_job_id"), table_name="webhook_deliveries")
    op.drop_index("ix_webhook_deliveries_due", table_name="webhook_deliveries")
    op.drop_table("webhook_deliveries")
    with op.batch_alter_table("jobs", schema=None, recreate="never") as batch_op:
        batch_op.drop_column("webhooks")
