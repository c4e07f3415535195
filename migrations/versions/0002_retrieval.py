"""retriever tables: documents, their sections and paragraphs (with embeddings)

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "retrieval_documents",
        sa.Column("id", sa.Integer()),
        sa.Column("collection", sa.String(255), nullable=False),
        sa.Column("name", sa.String(512), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("num_bytes", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_retrieval_documents"),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_retrieval_documents_collection", "retrieval_documents", ["collection"])
    op.create_table(
        "retrieval_sections",
        sa.Column("id", sa.Integer()),
        sa.Column("document_id", sa.Integer(), nullable=False),
        sa.Column("parent_id", sa.Integer()),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("level", sa.Integer(), nullable=False),
        sa.Column("title", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_retrieval_sections"),
        sa.ForeignKeyConstraint(
            ["document_id"],
            ["retrieval_documents.id"],
            name="fk_retrieval_sections_document_id_retrieval_documents",
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["parent_id"],
            ["retrieval_sections.id"],
            name="fk_retrieval_sections_parent_id_retrieval_sections",
            ondelete="CASCADE",
        ),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_retrieval_sections_document_id", "retrieval_sections", ["document_id"])
    op.create_table(
        "retrieval_paragraphs",
        sa.Column("id", sa.Integer()),
        sa.Column("collection", sa.String(255), nullable=False),
        sa.Column("document_id", sa.Integer(), nullable=False),
        sa.Column("section_id", sa.Integer(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("heading", sa.Text(), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("sentence_ends", sa.JSON(), nullable=False),
        sa.Column("embedding", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_retrieval_paragraphs"),
        sa.ForeignKeyConstraint(
            ["document_id"],
            ["retrieval_documents.id"],
            name="fk_retrieval_paragraphs_document_id_retrieval_documents",
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["section_id"],
            ["retrieval_sections.id"],
            name="fk_retrieval_paragraphs_section_id_retrieval_sections",
            ondelete="CASCADE",
        ),
        sa.UniqueConstraint("document_id", "position", name="uq_retrieval_paragraphs_document_id"),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_retrieval_paragraphs_collection", "retrieval_paragraphs", ["collection"])
    op.create_index("ix_retrieval_paragraphs_document_id", "retrieval_paragraphs", ["document_id"])


def downgrade() -> None:
    op.drop_table("retrieval_paragraphs")
    op.drop_table("retrieval_sections")
    op.drop_table("retrieval_documents")
