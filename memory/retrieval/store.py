"""Every query the retriever makes against its tables."""

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np
from sqlalchemy import Connection, delete, func, insert, select, update

from memory.retrieval.results import Document
from memory.retrieval.segment import Segmentation
from memory.retrieval.tables import collections, documents, paragraphs, sections

ID_CHUNK = 500  # ids per IN (...) list, well under every database's parameter limit


@dataclass
class IndexedParagraph:
    id: int
    indexed_text: str
    vector: np.ndarray


def insert_document(
    conn: Connection,
    collection: str,
    name: str,
    kind: str,
    num_bytes: int,
    segmentation: Segmentation,
    vectors: np.ndarray,
    encoder: str,
) -> tuple[Document, list[int]]:
    created_at = datetime.now(UTC)
    values = dict(collection=collection, name=name, kind=kind, num_bytes=num_bytes, created_at=created_at)
    document_id = conn.execute(insert(documents).values(**values)).inserted_primary_key[0]
    section_ids: list[int] = []
    for position, section in enumerate(segmentation.sections):
        parent = None if section.parent is None else section_ids[section.parent]
        row = dict(document_id=document_id, parent_id=parent, position=position)
        row |= dict(level=section.level, title=section.title)
        section_ids.append(conn.execute(insert(sections).values(**row)).inserted_primary_key[0])
    rows = [
        dict(
            collection=collection,
            document_id=document_id,
            section_id=section_ids[paragraph.section],
            position=position,
            heading=segmentation.section_path(paragraph.section),
            text=paragraph.text,
            sentence_ends=paragraph.sentence_ends,
            embedding=vectors[position].tobytes(),
            encoder=encoder,
        )
        for position, paragraph in enumerate(segmentation.paragraphs)
    ]
    returning = insert(paragraphs).returning(paragraphs.c.id, sort_by_parameter_order=True)
    paragraph_ids = list(conn.scalars(returning, rows)) if rows else []
    document = Document(document_id, collection, name, kind, num_bytes, len(paragraph_ids), created_at)
    return document, paragraph_ids


def delete_document(conn: Connection, document_id: int) -> tuple[str, list[int]]:
    """Returns the document's collection and paragraph ids; raises KeyError for an unknown id."""
    collection = conn.scalar(select(documents.c.collection).where(documents.c.id == document_id))
    if collection is None:
        raise KeyError(document_id)
    ids = list(conn.scalars(select(paragraphs.c.id).where(paragraphs.c.document_id == document_id)))
    conn.execute(delete(paragraphs).where(paragraphs.c.document_id == document_id))
    conn.execute(delete(sections).where(sections.c.document_id == document_id))
    conn.execute(delete(documents).where(documents.c.id == document_id))
    return collection, ids


def collection_encoder(conn: Connection, collection: str) -> str | None:
    return conn.scalar(select(collections.c.encoder).where(collections.c.name == collection))


def set_collection_encoder(conn: Connection, collection: str, encoder: str) -> None:
    row = collections.c.name == collection
    if not conn.execute(update(collections).where(row).values(encoder=encoder)).rowcount:
        conn.execute(insert(collections).values(name=collection, encoder=encoder))


def collections_by_encoder(conn: Connection) -> dict[str, int]:
    query = select(collections.c.encoder, func.count()).group_by(collections.c.encoder)
    return {encoder: count for encoder, count in conn.execute(query.order_by(collections.c.encoder))}


def delete_collection_row(conn: Connection, collection: str) -> None:
    conn.execute(delete(collections).where(collections.c.name == collection))


def stale_paragraph_ids(conn: Connection, collection: str, encoder: str) -> list[int]:
    """The collection's paragraphs embedded by another encoder than its own."""
    stale = (paragraphs.c.collection == collection) & (paragraphs.c.encoder != encoder)
    return list(conn.scalars(select(paragraphs.c.id).where(stale).order_by(paragraphs.c.id)))


def set_embeddings(conn: Connection, ids: list[int], vectors: np.ndarray, encoder: str) -> None:
    for paragraph_id, vector in zip(ids, vectors, strict=True):
        values = dict(embedding=vector.tobytes(), encoder=encoder)
        conn.execute(update(paragraphs).where(paragraphs.c.id == paragraph_id).values(**values))


def paragraph_ids_named(conn: Connection, collection: str, names: Iterable[str]) -> set[int]:
    """Ids of the paragraphs of the collection's documents with these names."""
    named = (documents.c.collection == collection) & documents.c.name.in_(sorted(set(names)))
    query = select(paragraphs.c.id).join(documents, documents.c.id == paragraphs.c.document_id).where(named)
    return set(conn.scalars(query))


def document_ids(conn: Connection, collection: str) -> list[int]:
    return list(conn.scalars(select(documents.c.id).where(documents.c.collection == collection)))


def list_documents(conn: Connection, collection: str) -> list[Document]:
    counts = (
        select(paragraphs.c.document_id, func.count().label("num_paragraphs"))
        .group_by(paragraphs.c.document_id)
        .subquery()
    )
    query = (
        select(documents, func.coalesce(counts.c.num_paragraphs, 0))
        .outerjoin(counts, counts.c.document_id == documents.c.id)
        .where(documents.c.collection == collection)
        .order_by(documents.c.id)
    )
    return [
        Document(row.id, row.collection, row.name, row.kind, row.num_bytes, row[-1], _utc(row.created_at))
        for row in conn.execute(query)
    ]


def _utc(moment: datetime) -> datetime:
    """SQLite hands back naive datetimes; they were written in UTC."""
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def paragraph_ids(conn: Connection, collection: str) -> set[int]:
    return set(conn.scalars(select(paragraphs.c.id).where(paragraphs.c.collection == collection)))


def paragraphs_to_index(conn: Connection, ids: Iterable[int]) -> Iterator[IndexedParagraph]:
    columns = (paragraphs.c.id, paragraphs.c.heading, paragraphs.c.text, paragraphs.c.embedding)
    for chunk in _chunks(sorted(ids)):
        for row in conn.execute(select(*columns).where(paragraphs.c.id.in_(chunk)).order_by(paragraphs.c.id)):
            vector = np.frombuffer(row.embedding, dtype=np.float32)
            yield IndexedParagraph(row.id, indexed_text(row.heading, row.text), vector)


def indexed_text(heading: str, text: str) -> str:
    """What BM25 and the embeddings see: the section titles give a paragraph its context."""
    return f"{heading}\n{text}" if heading else text


def _chunks(ids: list[int]) -> Iterator[list[int]]:
    for start in range(0, len(ids), ID_CHUNK):
        yield ids[start : start + ID_CHUNK]


@dataclass
class ParagraphRow:
    id: int
    collection: str
    document_id: int
    document_name: str
    document_kind: str
    section_id: int
    position: int
    heading: str
    text: str
    sentence_ends: list[int]


def paragraph_rows(conn: Connection, ids: Iterable[int]) -> dict[int, ParagraphRow]:
    rows = {}
    for chunk in _chunks(sorted(set(ids))):
        rows |= {row.id: row for row in _select_rows(conn, paragraphs.c.id.in_(chunk))}
    return rows


def document_rows(conn: Connection, document_id: int, positions: Iterable[int]) -> list[ParagraphRow]:
    """Paragraphs of one document at the given positions, in document order."""
    wanted = sorted(set(positions))
    return _select_rows(conn, (paragraphs.c.document_id == document_id) & paragraphs.c.position.in_(wanted))


def section_rows(conn: Connection, section_id: int) -> list[ParagraphRow]:
    return _select_rows(conn, paragraphs.c.section_id == section_id)


def section_sizes(conn: Connection, section_ids: Iterable[int]) -> dict[int, int]:
    return _count_by(conn, paragraphs.c.section_id, section_ids)


def document_lengths(conn: Connection, document_ids: Iterable[int]) -> dict[int, int]:
    return _count_by(conn, paragraphs.c.document_id, document_ids)


def _count_by(conn: Connection, column, keys: Iterable[int]) -> dict[int, int]:
    query = select(column, func.count()).where(column.in_(sorted(set(keys)))).group_by(column)
    return {key: count for key, count in conn.execute(query)}


def _select_rows(conn: Connection, condition) -> list[ParagraphRow]:
    columns = [paragraphs.c[name] for name in ("id", "collection", "document_id")]
    columns += [documents.c.name.label("document_name"), documents.c.kind.label("document_kind")]
    columns += [paragraphs.c[name] for name in ("section_id", "position", "heading", "text", "sentence_ends")]
    query = (
        select(*columns)
        .join(documents, documents.c.id == paragraphs.c.document_id)
        .where(condition)
        .order_by(paragraphs.c.document_id, paragraphs.c.position)
    )
    return [ParagraphRow(**row._mapping) for row in conn.execute(query)]
