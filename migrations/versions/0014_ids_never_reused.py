"""ids never reused: SQLite AUTOINCREMENT on jobs and sweeps; deliveries outlive their job

Revision ID: 0014_ids_never_reused
Revises: 0013_exclude_nodes
Create Date: 2026-12-12 09:00:00

**Ids.** SQLite hands a plain ``INTEGER PRIMARY KEY`` table's next row ``max(id) + 1``: deleting
the newest job gave its id to the next submission, and a pipeline's retried ``DELETE /jobs/6``
deleted someone else's job 6. ``AUTOINCREMENT`` (the ``sqlite_sequence`` table) never hands out
an id twice, so ``jobs`` and ``sweeps`` are rebuilt with it. The rebuild is safe for child rows:
``migrations/env.py`` runs every migration with foreign keys off (the DROP of the old table
cascades into nothing) and checks them after. The copy sets each sequence to the largest id
kept; an id deleted before this upgrade above that may be handed out once more, never again.
PostgreSQL's ``serial`` columns take their ids from sequences, which never go back: nothing to do
there. ``metric_records`` and ``webhook_deliveries`` had ``AUTOINCREMENT`` from the start.
Reflection does not see ``AUTOINCREMENT``: a later rebuild of one of these tables must pass
``table_kwargs={"sqlite_autoincrement": True}`` (tests/store/test_ids.py notices if not).

**Deliveries.** A job's pending webhook deliveries are sent even after the job is deleted
(docs/webhooks.md), so ``webhook_deliveries.job_id`` no longer references ``jobs``: the foreign
key (and its cascade) goes. A delivery's ``job_id`` still names its job, and since ids are never
reused no later job can be mistaken for it.
"""
import sqlalchemy as sa
from alembic import op

revision = "0014_ids_never_reused"
down_revision = "0013_exclude_nodes"
branch_labels = None
depends_on = None

AUTOINCREMENT = {"sqlite_autoincrement": True}
REBUILT = ("jobs", "sweeps")
DELIVERY_FK = "fk_webhook_deliveries_job_id_jobs"


def _sequence(table: str) -> int:
    """The table's ``sqlite_sequence`` value (0 when it has none yet)."""
    found = op.get_bind().execute(
        sa.text("SELECT seq FROM sqlite_sequence WHERE name = :t"), {"t": table}
    ).scalar()
    return int(found or 0)


def _keep_sequence(table: str, at_least: int) -> None:
    """A rebuild copies rows (the sequence becomes their largest id) and drops the old table
    with its sequence row: put back what the old table had already handed out."""
    if _sequence(table) < at_least:
        bind = op.get_bind()
        bind.execute(sa.text("DELETE FROM sqlite_sequence WHERE name = :t"), {"t": table})
        bind.execute(sa.text("INSERT INTO sqlite_sequence (name, seq) VALUES (:t, :s)"),
                     {"t": table, "s": at_least})


def upgrade() -> None:
    sqlite = op.get_bind().dialect.name == "sqlite"
    if sqlite:
        for table in REBUILT:
            with op.batch_alter_table(table, recreate="always", table_kwargs=AUTOINCREMENT):
                pass
    handed_out = _sequence("webhook_deliveries") if sqlite else 0
    with op.batch_alter_table("webhook_deliveries", table_kwargs=AUTOINCREMENT) as batch_op:
        batch_op.drop_constraint(DELIVERY_FK, type_="foreignkey")
    if sqlite:
        _keep_sequence("webhook_deliveries", handed_out)


def downgrade() -> None:
    sqlite = op.get_bind().dialect.name == "sqlite"
    # Deliveries of deleted jobs would break the foreign key put back.
    op.execute("DELETE FROM webhook_deliveries WHERE job_id NOT IN (SELECT id FROM jobs)")
    handed_out = _sequence("webhook_deliveries") if sqlite else 0
    with op.batch_alter_table("webhook_deliveries", table_kwargs=AUTOINCREMENT) as batch_op:
        batch_op.create_foreign_key(DELIVERY_FK, "jobs", ["job_id"], ["id"], ondelete="CASCADE")
    if sqlite:
        _keep_sequence("webhook_deliveries", handed_out)
        for table in REBUILT:  # reflected without AUTOINCREMENT: rebuilt as before 0020
            with op.batch_alter_table(table, recreate="always"):
                pass
