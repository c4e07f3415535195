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

import numpy as np
from sqlalchemy import Engine, inspect

from memory.retrieval import store
from memory.retrieval.collection_index import CollectionIndex
from memory.retrieval.embeddings import Encoder
from memory.retrieval.hybrid import Mode, rank
from memory.retrieval.ingest import MAX_FILE_BYTES, IngestError, extract_text, file_kind
from memory.retrieval.intent import Intent, classify
from memory.retrieval.results import Context, Document, Hit, Rejected, UploadResult
from memory.retrieval.segment import segment
from memory.retrieval.strategy import STRATEGIES
from memory.retrieval.tables import paragraphs
from memory.retrieval.tokenize import tokenize
from memory.retrieval.window import Candidate, Span, fill, grow, key_paragraphs, select

log = logging.getLogger(__name__)

MAX_K = 100
MAX_NAME_LENGTH = 512  # the column's length
WINDOW_CANDIDATES = 10  # hits a window may choose from
SUMMARY_KEY_PARAGRAPHS = 12
EXPANSION_TERMS = 5  # rarest terms of the latest turn added to a follow-up query
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
        self,
        collection: str,
        name: str,
        data: bytes | str,
        kind: str | None = None,
        max_bytes: int = MAX_FILE_BYTES,
    ) -> Document:
        """Indexes one file (.txt, .md, .html, .pdf, or `kind` for a name without that suffix);
        raises IngestError (a ValueError) when it can't."""
        _check_collection(collection)
        text = extract_text(name, data, max_bytes, kind)
        num_bytes = len(data.encode() if isinstance(data, str) else data)
        return self._add(collection, name, kind or file_kind(name), num_bytes, text)

    def add_documents(
        self, collection: str, files: Iterable[tuple[str, bytes | str]], max_bytes: int = MAX_FILE_BYTES
    ) -> UploadResult:
        """Indexes each (name, data); a file that can't be read, or whose name the collection holds
        already, is rejected with a reason, and the rest go in."""
        result = UploadResult()
        taken = {document.name for document in self.list_documents(collection)}
        for name, data in files:
            try:
                if name in taken:
                    raise IngestError(f"{name}: a document of this name is in the collection already")
                document = self.add_document(collection, name, data, max_bytes=max_bytes)
            except IngestError as error:
                result.rejected.append(Rejected(name, str(error)))
            else:
                result.added.append(document)
                taken.add(name)
        return result

    def add_turn(self, collection: str, name: str, text: str) -> Document:
        """Indexes one past turn of a session, so it can be found after it left the session's KV."""
        _check_collection(collection)
        if not text.strip():
            raise ValueError(f"{name} has no text to index")
        return self._add(collection, name, "turn", len(text.encode()), text)

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

    def build_context(
        self, query: str, collections: Sequence[str], recent_turns: Sequence[str], budget_tokens: int
    ) -> Context:
        """Classifies the query's intent and assembles its window: recent turns and passages from the
        collections, never more than budget_tokens by the model's tokenizer.  recent_turns are rendered
        turns ("user: ..."), oldest first."""
        collections, _ = _check_search(query, collections, 1, Mode.HYBRID)
        if budget_tokens < 1:
            raise ValueError(f"budget_tokens must be positive, got {budget_tokens}")
        recent_turns = list(recent_turns)
        decision = classify(query, recent_turns)
        strategy = STRATEGIES[decision.intent]
        budget = max(1, int(budget_tokens * strategy.budget_share))
        search_text = (
            f"{recent_turns[-1]}\n{query}" if strategy.expand_with_last_turn and recent_turns else query
        )
        query_vector = None if decision.intent == Intent.SUMMARY else self.encoder.encode_query(search_text)
        with self._lock, self.engine.connect() as conn:
            indexes = {collection: self._collection(collection) for collection in collections}
            spans = self._intent_spans(conn, indexes, decision.intent, query, recent_turns, query_vector)
            filled = fill(
                recent_turns,
                int(budget * strategy.turn_share),
                spans,
                budget,
                self.count_tokens,
                in_document_order=decision.intent == Intent.SUMMARY,
            )
        return Context(
            intent=decision.intent.value,
            intent_reason=decision.rule,
            budget_tokens=budget,
            num_tokens=filled.num_tokens,
            turns=filled.turns,
            passages=filled.passages,
            text=filled.text,
        )

    def _intent_spans(
        self, conn, indexes: dict, intent: Intent, query: str, recent_turns: list[str], query_vector
    ):
        """The candidate spans for the window: a summary's overview of each document, else the hits of the
        query's terms (and, for a follow-up, the rarest terms of the last turn)."""
        if intent == Intent.SUMMARY:
            return self._overview_spans(conn, list(indexes.values()))
        strategy = STRATEGIES[intent]
        terms = tokenize(query)
        if strategy.expand_with_last_turn and recent_turns:
            terms += _rarest_terms(recent_turns[-1], list(indexes.values()), set(terms))
        return self._hit_spans(conn, indexes, terms, query_vector, strategy.max_hits)

    def close(self) -> None:
        """Writes the snapshots of collections changed since their last one, for a fast next start."""
        with self._lock:
            for collection, index in self._indexes.items():
                if index.unsaved_changes:
                    index.save(self._snapshot_path(collection))

    def _add(self, collection: str, name: str, kind: str, num_bytes: int, text: str) -> Document:
        if not name.strip() or len(name) > MAX_NAME_LENGTH:
            raise IngestError(f"a document name is 1 to {MAX_NAME_LENGTH} characters, got {len(name)}")
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

    def _hit_spans(
        self, conn, indexes: dict[str, CollectionIndex], terms, query_vector, max_hits
    ) -> list[Span]:
        scored = rank(list(indexes.values()), terms, query_vector, WINDOW_CANDIDATES)
        rows = store.paragraph_rows(conn, [item.paragraph_id for item in scored])
        candidates = [
            Candidate(rows[item.paragraph_id], number, item.score, item.cosine)
            for number, item in enumerate(scored, start=1)
        ]
        view = _QueryView(conn, indexes, query_vector)
        return grow(select(candidates, max_hits), view, self.count_tokens)

    def _overview_spans(self, conn, indexes: list[CollectionIndex]) -> list[Span]:
        """Head and tail of the collections (oldest and newest paragraph), then key paragraphs."""
        ids = np.concatenate([np.frombuffer(index.paragraph_ids, dtype=np.int64) for index in indexes])
        live = np.concatenate([np.frombuffer(index.postings.live, dtype=np.uint8) for index in indexes]) == 1
        if not live.any():
            return []
        ids, vectors = ids[live], np.concatenate([index.vectors for index in indexes])[live]
        chosen = {int(ids.min()): "head", int(ids.max()): "tail"}
        for paragraph_id in key_paragraphs(ids, vectors, SUMMARY_KEY_PARAGRAPHS):
            chosen.setdefault(paragraph_id, "key")
        rows = store.paragraph_rows(conn, chosen)
        return [
            Span([rows[paragraph_id]], Candidate(rows[paragraph_id], number, 0.0, 0.0), reason)
            for number, (paragraph_id, reason) in enumerate(chosen.items(), start=1)
        ]

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


def _rarest_terms(text: str, indexes: list[CollectionIndex], exclude: set[str]) -> list[str]:
    """The latest turn's most specific words: what a follow-up like "why is that?" is about."""
    terms = set(tokenize(text)) - exclude
    frequency = {term: sum(index.postings.frequency(term) for index in indexes) for term in terms}
    return sorted((term for term in terms if frequency[term]), key=lambda term: (frequency[term], term))[
        :EXPANSION_TERMS
    ]


class _QueryView:
    """The documents around the hits, and how similar their paragraphs are to the query."""

    def __init__(self, conn, indexes: dict[str, CollectionIndex], query_vector: np.ndarray):
        self.conn, self.indexes, self.query_vector = conn, indexes, query_vector

    def rows_at(self, document_id: int, positions) -> list[store.ParagraphRow]:
        return store.document_rows(self.conn, document_id, positions)

    def section_size(self, section_id: int) -> int:
        return store.section_sizes(self.conn, [section_id]).get(section_id, 0)

    def section_rows(self, section_id: int) -> list[store.ParagraphRow]:
        return store.section_rows(self.conn, section_id)

    def similarity(self, rows) -> list[float]:
        similarities = []
        for row in rows:
            index = self.indexes[row.collection]
            similarities.append(float(index.vectors[index.slot_of[row.id]] @ self.query_vector))
        return similarities
