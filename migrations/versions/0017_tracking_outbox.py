"""tracking: the tracking_exports outbox (MLflow runs and TensorBoard files of jobs and sweeps)

Revision ID: 0017_tracking_outbox
Revises: 0016_identity
Create Date: 2026-12-07 19:00:00

One row per job (or sweep) to export, written in the transaction that creates it; the acting
supervisor exports its stored records by ``seq`` cursor (service.domain.tracking,
docs/tracking.md). A new table only: no existing row changes.
"""
import sqlalchemy as sa
from alembic import op

revision = "0017_tracking_outbox"
down_revision = "0016_identity"
branch_labels = None
depends_on = None

Int64 = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "tracking_exports",
        sa.Column("id", Int64, autoincrement=True, nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=True),
        sa.Column("sweep_id", sa.Integer(), nullable=True),
        sa.Column("mlflow", sa.Boolean(), nullable=False),
        sa.Column("tensorboard", sa.Boolean(), nullable=False),
        sa.Column("experiment", sa.String(length=256), nullable=True),
        sa.Column("log_outputs", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.Column("export_key", sa.String(length=32), nullable=False),
        sa.Column("experiment_id", sa.String(length=64), nullable=True),
        sa.Column("run_id", sa.String(length=64), nullable=True),
        sa.Column("artifact_uri", sa.String(length=1024), nullable=True),
        sa.Column("acked_seq", Int64, server_default="0", nullable=False),
        sa.Column("sent_seq", Int64, server_default="0", nullable=False),
        sa.Column("status", sa.String(length=16), nullable=True),
        sa.Column("mlflow_done", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.Column("tensorboard_done", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.Column("done", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("failures", sa.Integer(), server_default="0", nullable=False),
        sa.Column("next_try_at", sa.DateTime(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"],
            name=op.f("fk_tracking_exports_job_id_jobs"), ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tracking_exports")),
        sa.UniqueConstraint("job_id", name=op.f("uq_tracking_exports_job_id")),
        sa.UniqueConstraint("sweep_id", name=op.f("uq_tracking_exports_sweep_id")),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_tracking_exports_due", "tracking_exports", ["done", "next_try_at"],
                    unique=False)


def downgrade() -> None:
    op.drop_index("ix_tracking_exports_due", table_name="tracking_exports")
    op.drop_table("tracking_exports")
