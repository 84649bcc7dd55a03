"""index on jobs.token_hash (bearer tokens are looked up by hash)

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02 15:10:00
"""
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_jobs_token_hash"), ["token_hash"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_jobs_token_hash"))
