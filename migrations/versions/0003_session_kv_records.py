"""session KV records the admin page reads: location and counts per session (one row each), and how a
user message's sources were retrieved

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

SNAPSHOT_COLUMNS = [
    sa.Column("location", sa.String(8), nullable=False, server_default="none"),
    sa.Column("cached_tokens", sa.Integer(), nullable=False, server_default="0"),
    sa.Column("evicted_tokens", sa.Integer(), nullable=False, server_default="0"),
    sa.Column("blocks", sa.Integer(), nullable=False, server_default="0"),
    sa.Column("warning", sa.Text()),
    sa.Column("updated_at", sa.DateTime(timezone=True)),  # SQLite adds no column with a computed default
]


def upgrade() -> None:
    op.add_column("messages", sa.Column("retrieval", sa.JSON()))
    for column in SNAPSHOT_COLUMNS:
        op.add_column("session_kv_snapshots", column)
    op.drop_index("ix_session_kv_snapshots_session_id", "session_kv_snapshots")
    op.create_index("ix_session_kv_snapshots_session_id", "session_kv_snapshots", ["session_id"], unique=True)


def downgrade() -> None:
    op.drop_index("ix_session_kv_snapshots_session_id", "session_kv_snapshots")
    op.create_index("ix_session_kv_snapshots_session_id", "session_kv_snapshots", ["session_id"])
    for column in reversed(SNAPSHOT_COLUMNS):
        op.drop_column("session_kv_snapshots", column.name)
    op.drop_column("messages", "retrieval")
