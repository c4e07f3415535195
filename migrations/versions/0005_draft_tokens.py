"""Per reply: speculative decoding's drafted and accepted tokens

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("messages") as messages:
        messages.add_column(sa.Column("draft_tokens", sa.Integer(), nullable=True))
        messages.add_column(sa.Column("accepted_tokens", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("messages") as messages:
        messages.drop_column("accepted_tokens")
        messages.drop_column("draft_tokens")
