"""identity: teams, users, personal tokens, package grants, the audit log; jobs' and sweeps' owner

Revision ID: 0016_identity
Revises: 0015_sweep_record
Create Date: 2026-12-12 10:00:00

Who is who on a shared box (docs/security.md, "Users, teams and roles"). ``teams``, ``users``
and ``api_tokens`` (only each token's SHA-256) are new; ``package_grants`` says which teams
uploaded a package; ``audit_log`` is append-only. ``jobs`` and ``sweeps`` gain ``owner`` and
``team`` (names): existing rows get null, which only admins see. The new tables' ids are never
reused (``sqlite_autoincrement``). The jobs and sweeps columns are added in place
(``recreate="never"``, see 0005).
"""
import sqlalchemy as sa
from alembic import op

revision = "0016_identity"
down_revision = "0015_sweep_record"
branch_labels = None
depends_on = None

Int64 = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "teams",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("unix_user", sa.String(length=32), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_teams")),
        sa.UniqueConstraint("name", name=op.f("uq_teams_name")),
        sqlite_autoincrement=True,
    )
    op.create_table(
        "users",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("team", sa.String(length=64), nullable=True),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("disabled", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(["team"], ["teams.name"], name=op.f("fk_users_team_teams")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_users")),
        sa.UniqueConstraint("name", name=op.f("uq_users_name")),
        sqlite_autoincrement=True,
    )
    op.create_index(op.f("ix_users_team"), "users", ["team"], unique=False)
    op.create_table(
        "api_tokens",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("expires_at", sa.DateTime(), nullable=True),
        sa.Column("last_used_at", sa.DateTime(), nullable=True),
        sa.Column("revoked_at", sa.DateTime(), nullable=True),
        sa.ForeignKeyConstraint(["user_id"], ["users.id"],
                                name=op.f("fk_api_tokens_user_id_users"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_tokens")),
        sa.UniqueConstraint("token_hash", name=op.f("uq_api_tokens_token_hash")),
        sqlite_autoincrement=True,
    )
    op.create_index(op.f("ix_api_tokens_user_id"), "api_tokens", ["user_id"], unique=False)
    op.create_table(
        "package_grants",
        sa.Column("digest", sa.String(length=71), nullable=False),
        sa.Column("team", sa.String(length=64), nullable=False),
        sa.Column("granted_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("digest", "team", name=op.f("pk_package_grants")),
    )
    op.create_table(
        "audit_log",
        sa.Column("id", Int64, autoincrement=True, nullable=False),
        sa.Column("at", sa.DateTime(), nullable=False),
        sa.Column("actor", sa.String(length=64), nullable=True),
        sa.Column("via", sa.String(length=16), nullable=True),
        sa.Column("token_id", sa.Integer(), nullable=True),
        sa.Column("method", sa.String(length=8), nullable=False),
        sa.Column("route", sa.String(length=200), nullable=False),
        sa.Column("target", sa.String(length=100), nullable=True),
        sa.Column("status", sa.Integer(), nullable=False),
        sa.Column("client", sa.String(length=64), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_log")),
        sqlite_autoincrement=True,
    )
    op.create_index(op.f("ix_audit_log_at"), "audit_log", ["at"], unique=False)
    op.create_index(op.f("ix_audit_log_actor"), "audit_log", ["actor"], unique=False)
    with op.batch_alter_table("jobs", schema=None, recreate="never") as batch_op:
        batch_op.add_column(sa.Column("owner", sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column("team", sa.String(length=64), nullable=True))
    op.create_index("ix_jobs_team_id", "jobs", ["team", "id"], unique=False)
    with op.batch_alter_table("sweeps", schema=None, recreate="never") as batch_op:
        batch_op.add_column(sa.Column("owner", sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column("team", sa.String(length=64), nullable=True))
    op.create_index(op.f("ix_sweeps_team"), "sweeps", ["team"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_sweeps_team"), table_name="sweeps")
    with op.batch_alter_table("sweeps", schema=None, recreate="never") as batch_op:
        batch_op.drop_column("team")
        batch_op.drop_column("owner")
    op.drop_index("ix_jobs_team_id", table_name="jobs")
    with op.batch_alter_table("jobs", schema=None, recreate="never") as batch_op:
        batch_op.drop_column("team")
        batch_op.drop_column("owner")
    op.drop_index(op.f("ix_audit_log_actor"), table_name="audit_log")
    op.drop_index(op.f("ix_audit_log_at"), table_name="audit_log")
    op.drop_table("audit_log")
    op.drop_table("package_grants")
    op.drop_index(op.f("ix_api_tokens_user_id"), table_name="api_tokens")
    op.drop_table("api_tokens")
    op.drop_index(op.f("ix_users_team"), table_name="users")
    op.drop_table("users")
    op.drop_table("teams")
