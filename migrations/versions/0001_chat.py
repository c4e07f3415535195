"""chat service tables: users, API keys, knowledge bases, sessions, messages, session KV records

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def timestamp(name: str) -> sa.Column:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=False)


def status_enum(name: str, *values: str) -> sa.Enum:
    return sa.Enum(*values, name=name, native_enum=False, length=16)


def upgrade() -> None:
    op.create_table(
        "users",
        sa.Column("id", sa.Integer()),
        sa.Column("username", sa.String(64), nullable=False),
        sa.Column("password_hash", sa.String(256)),
        sa.Column("role", status_enum("role", "admin", "user"), nullable=False),
        timestamp("created_at"),
        sa.PrimaryKeyConstraint("id", name="pk_users"),
        sa.UniqueConstraint("username", name="uq_users_username"),
    )
    op.create_table(
        "api_keys",
        sa.Column("id", sa.Integer()),
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(100), nullable=False),
        sa.Column("key_hash", sa.String(64), nullable=False),
        timestamp("created_at"),
        sa.PrimaryKeyConstraint("id", name="pk_api_keys"),
        sa.ForeignKeyConstraint(
            ["user_id"], ["users.id"], name="fk_api_keys_user_id_users", ondelete="CASCADE"
        ),
        sa.UniqueConstraint("key_hash", name="uq_api_keys_key_hash"),
    )
    op.create_index("ix_api_keys_user_id", "api_keys", ["user_id"])
    op.create_table(
        "knowledge_bases",
        sa.Column("id", sa.String(32)),
        sa.Column("owner_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        timestamp("created_at"),
        sa.PrimaryKeyConstraint("id", name="pk_knowledge_bases"),
        sa.ForeignKeyConstraint(
            ["owner_id"], ["users.id"], name="fk_knowledge_bases_owner_id_users", ondelete="CASCADE"
        ),
    )
    op.create_index("ix_knowledge_bases_owner_id", "knowledge_bases", ["owner_id"])
    op.create_table(
        "chat_sessions",
        sa.Column("id", sa.String(32)),
        sa.Column("owner_id", sa.Integer(), nullable=False),
        sa.Column("title", sa.String(200), nullable=False),
        timestamp("created_at"),
        timestamp("updated_at"),
        sa.Column("archived", sa.Boolean(), nullable=False),
        sa.Column("pinned", sa.Boolean(), nullable=False),
        sa.Column("system_prompt", sa.Text()),
        sa.Column("knowledge_base_id", sa.String(32)),
        sa.Column("temperature", sa.Double()),
        sa.Column("kv_budget_tokens", sa.Integer()),
        sa.PrimaryKeyConstraint("id", name="pk_chat_sessions"),
        sa.ForeignKeyConstraint(
            ["owner_id"], ["users.id"], name="fk_chat_sessions_owner_id_users", ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["knowledge_base_id"],
            ["knowledge_bases.id"],
            name="fk_chat_sessions_knowledge_base_id_knowledge_bases",
            ondelete="SET NULL",
        ),
    )
    op.create_index("ix_chat_sessions_owner_updated", "chat_sessions", ["owner_id", "updated_at"])
    op.create_index("ix_chat_sessions_knowledge_base_id", "chat_sessions", ["knowledge_base_id"])
    op.create_table(
        "messages",
        sa.Column("id", sa.Integer()),
        sa.Column("session_id", sa.String(32), nullable=False),
        sa.Column("parent_id", sa.Integer()),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("content", sa.Text(), nullable=False),
        sa.Column("context", sa.JSON()),
        sa.Column(
            "status",
            status_enum("messagestatus", "pending", "streaming", "done", "error", "aborted", "interrupted"),
            nullable=False,
        ),
        sa.Column("error", sa.Text()),
        sa.Column("finish_reason", sa.String(16)),
        sa.Column("replica_id", sa.String(64)),
        sa.Column("prompt_tokens", sa.Integer()),
        sa.Column("cached_tokens", sa.Integer()),
        sa.Column("completion_tokens", sa.Integer()),
        sa.Column("ttft_seconds", sa.Double()),
        sa.Column("tokens_per_second", sa.Double()),
        sa.Column("citations", sa.JSON()),
        timestamp("created_at"),
        timestamp("updated_at"),
        sa.PrimaryKeyConstraint("id", name="pk_messages"),
        sa.ForeignKeyConstraint(
            ["session_id"],
            ["chat_sessions.id"],
            name="fk_messages_session_id_chat_sessions",
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["parent_id"], ["messages.id"], name="fk_messages_parent_id_messages", ondelete="CASCADE"
        ),
    )
    op.create_index("ix_messages_session_id", "messages", ["session_id"])
    op.create_index("ix_messages_parent_id", "messages", ["parent_id"])
    op.create_table(
        "session_kv_snapshots",
        sa.Column("id", sa.Integer()),
        sa.Column("session_id", sa.String(32), nullable=False),
        sa.Column("up_to_message_id", sa.Integer()),
        sa.Column("model_name", sa.String(200), nullable=False),
        sa.Column("path", sa.String(500), nullable=False),
        sa.Column("num_tokens", sa.Integer(), nullable=False),
        sa.Column("num_bytes", sa.Integer(), nullable=False),
        timestamp("created_at"),
        sa.PrimaryKeyConstraint("id", name="pk_session_kv_snapshots"),
        sa.ForeignKeyConstraint(
            ["session_id"],
            ["chat_sessions.id"],
            name="fk_session_kv_snapshots_session_id_chat_sessions",
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["up_to_message_id"],
            ["messages.id"],
            name="fk_session_kv_snapshots_up_to_message_id_messages",
            ondelete="SET NULL",
        ),
    )
    op.create_index("ix_session_kv_snapshots_session_id", "session_kv_snapshots", ["session_id"])
    op.create_table(
        "eviction_events",
        sa.Column("id", sa.Integer()),
        sa.Column("session_id", sa.String(32), nullable=False),
        sa.Column("policy", sa.String(32), nullable=False),
        sa.Column("num_tokens_before", sa.Integer(), nullable=False),
        sa.Column("num_tokens_evicted", sa.Integer(), nullable=False),
        sa.Column("details", sa.JSON()),
        timestamp("created_at"),
        sa.PrimaryKeyConstraint("id", name="pk_eviction_events"),
        sa.ForeignKeyConstraint(
            ["session_id"],
            ["chat_sessions.id"],
            name="fk_eviction_events_session_id_chat_sessions",
            ondelete="CASCADE",
        ),
    )
    op.create_index("ix_eviction_events_session_id", "eviction_events", ["session_id"])


def downgrade() -> None:
    for table in (
        "eviction_events",
        "session_kv_snapshots",
        "messages",
        "chat_sessions",
        "knowledge_bases",
        "api_keys",
        "users",
    ):
        op.drop_table(table)
