"""The retriever the chat service uses: add and delete documents, search, build a context window.

Documents belong to a collection (a key the caller chooses, e.g. "kb:3" or "session:ab12"); every query is
scoped to collections.  The database holds documents, paragraphs and embeddings; each collection's index is
loaded into memory on first use, from its snapshot file when one exists, and kept in step incrementally.
"""

import hashlib
import logging
import threading
import zipfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from sqlalchemy import Engine, inspect

from memory.retrieval import store
from memory.retrieval.collection_index import CollectionIndex
from memory.retrieval.embeddings import Encoder
from memory.retrieval.hybrid import Mode, rank
from memory.retrieval.ingest import MAX_FILE_BYTES, IngestError, extract_text, file_kind
from memory.retrieval.results import Document, Hit, Rejected, UploadResult
from memory.retrieval.segment import segment
from memory.retrieval.tables import paragraphs
from memory.retrieval.tokenize import tokenize

log = logging.getLogger(__name__)

MAX_K = 100
SNAPSHOT_EVERY = 1000  # unsaved paragraph changes before a collection's snapshot is rewritten


class Retriever:
    def __init__(
        self,
        engine: Engine,
        data_dir: Path,
        count_tokens: Callable[[str], int],
        encoder: Encoder | None = None,
    ):
        if not inspect(engine).has_table(paragraphs.name):
            raise RuntimeError("the retrieval tables are missing: run the migrations (alembic upgrade head)")
        self.engine = engine
        self.snapshot_dir = Path(data_dir) / "retrieval-index"
        self.snapshot_dir.mkdir(parents=True, exist_ok=True)
        self.count_tokens = count_tokens
        self.encoder = encoder or Encoder()
        self._indexes: dict[str, CollectionIndex] = {}
        self._lock = threading.RLock()  # guards the in-memory indexes; queries take it for milliseconds

    def add_document(
        self, collection: str, name: str, data: bytes | str, max_bytes: int = MAX_FILE_BYTES
    ) -> Document:
        """Indexes one file (.txt, .md, .html, .pdf); raises IngestError (a ValueError) if it can't."""
        _check_collection(collection)
        text = extract_text(name, data, max_bytes)
        num_bytes = len(data.encode() if isinstance(data, str) else data)
        return self._add(collection, name, file_kind(name), num_bytes, text)

    def add_documents(self, collection: str, files: Iterable[tuple[str, bytes | str]]) -> UploadResult:
        """Indexes each (name, data); a file that can't be read is rejected with a reason, the rest go in."""
        result = UploadResult()
        for name, data in files:
            try:
                result.added.append(self.add_document(collection, name, data))
            except IngestError as error:
                result.rejected.append(Rejected(name, str(error)))
        return result

    def add_turn(self, collection: str, turn_number: int, role: str, text: str) -> Document:
        """Indexes one past turn of a session, so it can be found after it left the session's KV."""
        _check_collection(collection)
        if not text.strip():
            raise ValueError(f"turn {turn_number} has no text to index")
        return self._add(collection, f"turn {turn_number} ({role})", "turn", len(text.encode()), text)

    def delete_document(self, document_id: int) -> None:
        with self._lock, self.engine.begin() as conn:
            try:
                collection, paragraph_ids = store.delete_document(conn, document_id)
            except KeyError:
                raise ValueError(f"no document with id {document_id}") from None
            index = self._indexes.get(collection)
            for paragraph_id in paragraph_ids if index else ():
                index.remove(paragraph_id)

    def delete_collection(self, collection: str) -> int:
        """Deletes every document of the collection (e.g. with its session); returns how many."""
        with self._lock:
            with self.engine.begin() as conn:
                document_ids = store.document_ids(conn, collection)
                for document_id in document_ids:
                    store.delete_document(conn, document_id)
            self._indexes.pop(collection, None)
            self._snapshot_path(collection).unlink(missing_ok=True)
        return len(document_ids)

    def list_documents(self, collection: str) -> list[Document]:
        with self.engine.connect() as conn:
            return store.list_documents(conn, collection)

    def search(
        self, query: str, collections: Sequence[str], k: int = 5, mode: Mode | str = Mode.HYBRID
    ) -> list[Hit]:
        """The k best paragraphs of the collections for the query, best first."""
        collections, mode = _check_search(query, collections, k, mode)
        query_vector = None if mode == Mode.BM25 else self.encoder.encode_query(query)
        with self._lock:
            indexes = [self._collection(collection) for collection in collections]
            scored = rank(indexes, tokenize(query), query_vector, k, mode)
        with self.engine.connect() as conn:
            rows = store.paragraph_rows(conn, [item.paragraph_id for item in scored])
        return [_hit(rows[item.paragraph_id], item) for item in scored if item.paragraph_id in rows]

    def close(self) -> None:
        """Writes the snapshots of collections changed since their last one, for a fast next start."""
        with self._lock:
            for collection, index in self._indexes.items():
                if index.unsaved_changes:
                    index.save(self._snapshot_path(collection))

    def _add(self, collection: str, name: str, kind: str, num_bytes: int, text: str) -> Document:
        segmentation = segment(text)
        if not segmentation.paragraphs:
            raise IngestError(f"{name}: no text found in the file")
        indexed_texts = [
            store.indexed_text(segmentation.section_path(paragraph.section), paragraph.text)
            for paragraph in segmentation.paragraphs
        ]
        vectors = self.encoder.encode_passages(indexed_texts)  # the slow part, outside the lock
        with self._lock:
            with self.engine.begin() as conn:
                document, paragraph_ids = store.insert_document(
                    conn, collection, name, kind, num_bytes, segmentation, vectors
                )
            index = self._indexes.get(collection)  # not loaded: its next load reads these rows
            if index is not None:
                for paragraph_id, indexed, vector in zip(paragraph_ids, indexed_texts, vectors, strict=True):
                    index.add(paragraph_id, indexed, vector)
                self._save_if_due(index)
        return document

    def _collection(self, collection: str) -> CollectionIndex:
        if collection not in self._indexes:
            index = self._load(collection)
            self._save_if_due(index)
            self._indexes[collection] = index
        return self._indexes[collection]

    def _load(self, collection: str) -> CollectionIndex:
        """The snapshot, brought in step with the database; a fresh build when there is no snapshot."""
        path = self._snapshot_path(collection)
        index = CollectionIndex(collection)
        if path.exists():
            try:
                index = CollectionIndex.load(path, collection)
            except (OSError, ValueError, KeyError, zipfile.BadZipFile) as error:
                log.warning("rebuilding the index of %r: unusable snapshot %s (%s)", collection, path, error)
        with self.engine.connect() as conn:
            in_database = store.paragraph_ids(conn, collection)
            for paragraph_id in set(index.slot_of) - in_database:
                index.remove(paragraph_id)
            for paragraph in store.paragraphs_to_index(conn, in_database - set(index.slot_of)):
                index.add(paragraph.id, paragraph.indexed_text, paragraph.vector)
        return index

    def _save_if_due(self, index: CollectionIndex) -> None:
        if index.unsaved_changes >= max(SNAPSHOT_EVERY, len(index) // 10):
            index.save(self._snapshot_path(index.collection))

    def _snapshot_path(self, collection: str) -> Path:
        return self.snapshot_dir / f"{hashlib.sha256(collection.encode()).hexdigest()[:32]}.npz"


def _check_collection(collection: str) -> None:
    if not isinstance(collection, str) or not collection or len(collection) > 255:
        raise ValueError(f"a collection is a non-empty string of at most 255 characters, got {collection!r}")


def _check_search(query: str, collections: Sequence[str], k: int, mode: Mode | str) -> tuple[list[str], Mode]:
    if not isinstance(query, str) or not query.strip():
        raise ValueError("the query is empty")
    collections = [collections] if isinstance(collections, str) else list(collections)
    if not collections:
        raise ValueError("a search needs at least one collection")
    for collection in collections:
        _check_collection(collection)
    if not 1 <= k <= MAX_K:
        raise ValueError(f"k must be between 1 and {MAX_K}, got {k}")
    try:
        return collections, Mode(mode)
    except ValueError:
        raise ValueError(f"mode must be one of {[m.value for m in Mode]}, got {mode!r}") from None


def _hit(row: store.ParagraphRow, scored) -> Hit:
    return Hit(
        paragraph_id=row.id,
        document_id=row.document_id,
        document_name=row.document_name,
        collection=row.collection,
        heading=row.heading,
        position=row.position,
        text=row.text,
        score=scored.score,
        bm25=scored.bm25,
        cosine=scored.cosine,
    )
