"""The retriever's tables, on their own MetaData so the chat service's migrations can include them.

Every paragraph row keeps what a restart needs to rebuild the in-memory index without re-embedding: its
text (re-tokenized), its embedding (float32 bytes) and the encoder that made it.  A collection's row names
the encoder its paragraphs must have: a paragraph with another one (a change of encoder cut short) is
embedded again before the collection is searched.  Ids never get reused (sqlite_autoincrement), so an
index snapshot that names a paragraph id can trust it still means the same paragraph.
"""

from sqlalchemy import (
    JSON,
    Column,
    DateTime,
    ForeignKey,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
)

# Constraint names that are the same on every database and in migrations (the chat service's tables use it
# too), so later migrations can drop or alter them.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}
metadata = MetaData(naming_convention=NAMING_CONVENTION)

collections = Table(
    "retrieval_collections",
    metadata,
    Column("name", String(255), primary_key=True),
    Column("encoder", String(64), nullable=False),
)

documents = Table(
    "retrieval_documents",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("collection", String(255), nullable=False, index=True),
    Column("name", String(512), nullable=False),
    Column("kind", String(16), nullable=False),
    Column("num_bytes", Integer, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    sqlite_autoincrement=True,
)

sections = Table(
    "retrieval_sections",
    metadata,
    Column("id", Integer, primary_key=True),
    Column(
        "document_id",
        Integer,
        ForeignKey("retrieval_documents.id", ondelete="CASCADE"),
        nullable=False,
        index=True,
    ),
    Column("parent_id", Integer, ForeignKey("retrieval_sections.id", ondelete="CASCADE")),
    Column("position", Integer, nullable=False),
    Column("level", Integer, nullable=False),
    Column("title", Text, nullable=False),
    sqlite_autoincrement=True,
)

paragraphs = Table(
    "retrieval_paragraphs",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("collection", String(255), nullable=False, index=True),
    Column(
        "document_id",
        Integer,
        ForeignKey("retrieval_documents.id", ondelete="CASCADE"),
        nullable=False,
        index=True,
    ),
    Column("section_id", Integer, ForeignKey("retrieval_sections.id", ondelete="CASCADE"), nullable=False),
    Column("position", Integer, nullable=False),  # order in the document; neighbours are position +- 1
    Column("heading", Text, nullable=False),  # titles of the enclosing sections, indexed with the text
    Column("text", Text, nullable=False),
    Column("sentence_ends", JSON, nullable=False),
    Column("embedding", LargeBinary, nullable=False),
    Column("encoder", String(64), nullable=False),
    UniqueConstraint("document_id", "position"),
    sqlite_autoincrement=True,
)
