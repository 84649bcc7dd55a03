"""supervisor lease: which server process supervises, until when

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-03 08:45:00
"""
import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    lease = op.create_table(
        "supervisor_lease",
        sa.Column("name", sa.String(length=32), nullable=False),
        sa.Column("owner", sa.String(length=200), nullable=True),
        sa.Column("host", sa.String(length=200), nullable=True),
        sa.Column("generation", sa.Integer(), server_default="0", nullable=False),
        sa.Column("expires_at", sa.Float(), server_default="0", nullable=False),
        sa.Column("renewed_at", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_supervisor_lease")),
    )
    # The one row every candidate competes for: expired from the start.
    op.bulk_insert(lease, [{"name": "supervisor", "generation": 0, "expires_at": 0.0}])


def downgrade() -> None:
    op.drop_table("supervisor_lease")
