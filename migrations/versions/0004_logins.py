"""UI logins kept in the database (revocable, expiring), users that can be disabled, user ids never reused

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # SQLite reuses the largest deleted rowid unless the table is AUTOINCREMENT, which only a copy of the
    # table can add (chatsvc.db.migrate turns SQLite's foreign keys off meanwhile, or dropping the old table
    # would cascade).  Postgres never reuses a sequence's values.
    recreate = "always" if op.get_context().dialect.name == "sqlite" else "auto"
    with op.batch_alter_table(
        "users", recreate=recreate, table_kwargs={"sqlite_autoincrement": True}
    ) as users:
        users.add_column(sa.Column("disabled", sa.Boolean(), nullable=False, server_default=sa.false()))
    op.create_table(
        "logins",
        sa.Column("id", sa.String(32)),
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("token_hash", sa.String(64), nullable=False),
        sa.Column("address", sa.String(64)),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_logins"),
        sa.ForeignKeyConstraint(
            ["user_id"], ["users.id"], name="fk_logins_user_id_users", ondelete="CASCADE"
        ),
        sa.UniqueConstraint("token_hash", name="uq_logins_token_hash"),
    )
    op.create_index("ix_logins_user_id", "logins", ["user_id"])


def downgrade() -> None:
    op.drop_index("ix_logins_user_id", "logins")
    op.drop_table("logins")
    with op.batch_alter_table("users") as users:
        users.drop_column("disabled")
