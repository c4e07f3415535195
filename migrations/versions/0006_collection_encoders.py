"""Per retrieval collection and paragraph: the encoder of the embeddings (MiniLM for everything before)

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "retrieval_collections",
        sa.Column("name", sa.String(255)),
        sa.Column("encoder", sa.String(64), nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_retrieval_collections"),
    )
    op.execute(
        "INSERT INTO retrieval_collections (name, encoder) "
        "SELECT DISTINCT collection, 'minilm' FROM retrieval_documents"
    )
    with op.batch_alter_table("retrieval_paragraphs") as paragraphs:
        paragraphs.add_column(sa.Column("encoder", sa.String(64), nullable=False, server_default="minilm"))
    with op.batch_alter_table("retrieval_paragraphs") as paragraphs:
        paragraphs.alter_column("encoder", server_default=None)


def downgrade() -> None:
    with op.batch_alter_table("retrieval_paragraphs") as paragraphs:
        paragraphs.drop_column("encoder")
    op.drop_table("retrieval_collections")
