"""executor and opaque reference instead of pid/pid_create_time

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-03 08:30:00

Existing rows were all run by the local executor: a job that has a pid gets ``executor='local'``
and ``executor_ref`` = ``{"pid": <pid>, "create_time": <pid_create_time>}``, the local
executor's reference (``service.executor.local``; spelled here because a migration is frozen
in time), so a server upgraded while jobs run re-adopts them.

``recreate="never"``: SQLite (3.35+) adds and drops these columns in place. Rebuilding ``jobs``
instead would drop the old table, and with ``foreign_keys=ON`` that cascades into the metric
records, labels and allocations of every job.
"""
import json

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

LOCAL = "local"


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None, recreate="never") as batch_op:
        batch_op.add_column(sa.Column("executor", sa.String(length=16), nullable=True))
        batch_op.add_column(sa.Column("executor_ref", sa.Text(), nullable=True))
    conn = op.get_bind()
    rows = conn.execute(
        sa.text("SELECT id, pid, pid_create_time FROM jobs WHERE pid IS NOT NULL")
    ).all()
    for job_id, pid, create_time in rows:
        conn.execute(
            sa.text("UPDATE jobs SET executor = :executor, executor_ref = :ref WHERE id = :id"),
            {"executor": LOCAL, "id": job_id,
             "ref": json.dumps({"pid": pid, "create_time": create_time})},
        )
    with op.batch_alter_table("jobs", schema=None, recreate="never") as batch_op:
        batch_op.drop_column("pid_create_time")
        batch_op.drop_column("pid")


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None, recreate="never") as batch_op:
        batch_op.add_column(sa.Column("pid", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("pid_create_time", sa.Float(), nullable=True))
    conn = op.get_bind()
    rows = conn.execute(
        sa.text(
            "SELECT id, executor_ref FROM jobs"
            " WHERE executor = :local AND executor_ref IS NOT NULL"
        ),
        {"local": LOCAL},
    ).all()
    for job_id, ref in rows:
        try:
            data = json.loads(ref)
            pid, create_time = int(data["pid"]), data.get("create_time")
        except (ValueError, TypeError, KeyError):
            continue
        conn.execute(
            sa.text("UPDATE jobs SET pid = :pid, pid_create_time = :ct WHERE id = :id"),
            {"pid": pid, "ct": create_time, "id": job_id},
        )
    with op.batch_alter_table("jobs", schema=None, recreate="never") as batch_op:
        batch_op.drop_column("executor_ref")
        batch_op.drop_column("executor")
