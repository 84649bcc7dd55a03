"""pause, resume and preemption: jobs.state_changes, pauses, preemptions, preempted_by, preemptible

Revision ID: 0012_pause
Revises: 0011_sweeps
Create Date: 2026-12-04 18:00:00

A job may now leave ``running`` for ``pausing``/``paused`` and come back to ``queued``
(docs/lifecycle.md), so its states no longer only advance. ``state_changes`` counts every state
change (``repository.transition``): the event stream's cursor (``GET /jobs/{id}/events``) uses it
as the state part of its event ids. Existing rows get the count their state implies when states
only advanced (queued 0, starting 1, running 2, ended 3), which is what those ids held before.
``pauses`` counts the job's pauses (each adds an attempt beyond ``max_restarts + 1``),
``preemptions`` those the supervisor made to run a more urgent job, ``preempted_by`` the job
that preempted it last (null once it runs again), and ``preemptible`` copies the spec's field so
the scheduler finds candidates by an index-free filter on running jobs. Added in place
(``recreate="never"``, see 0005).
"""
import sqlalchemy as sa
from alembic import op

revision = "0012_pause"
down_revision = "0011_sweeps"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None, recreate="never") as batch_op:
        batch_op.add_column(
            sa.Column("state_changes", sa.Integer(), server_default="0", nullable=False))
        batch_op.add_column(sa.Column("pauses", sa.Integer(), server_default="0", nullable=False))
        batch_op.add_column(
            sa.Column("preemptions", sa.Integer(), server_default="0", nullable=False))
        batch_op.add_column(sa.Column("preempted_by", sa.Integer(), nullable=True))
        batch_op.add_column(
            sa.Column("preemptible", sa.Boolean(), server_default=sa.false(), nullable=False))
    op.execute(
        "UPDATE jobs SET state_changes = CASE state WHEN 'queued' THEN 0 WHEN 'starting' THEN 1 "
        "WHEN 'running' THEN 2 ELSE 3 END"
    )


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None, recreate="never") as batch_op:
        for column in ("preemptible", "preempted_by", "preemptions", "pauses", "state_changes"):
            batch_op.drop_column(column)
