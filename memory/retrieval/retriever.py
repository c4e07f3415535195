"""The retriever the chat service uses: add and delete documents, search, build a context window.

Documents belong to a collection (a key the caller chooses, e.g. "kb:3" or "session:ab12"); every query is
scoped to collections.  The database holds documents, paragraphs and embeddings; each collection's index is
loaded into memory on first use, from its snapshot file when one exists, and kept in step incrementally.
"""

import hashlib
import logging
import threading
import zipfile
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np
from sqlalchemy import Engine, inspect

from memory.retrieval import store
from memory.retrieval.collection_index import CollectionIndex
from memory.retrieval.embeddings import DEFAULT_ENCODER, ENCODERS, Encoder, encoder_for_text
from memory.retrieval.hybrid import Mode, offered, rank
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
EMBED_BATCH = 64  # paragraphs embedded again per database write when a collection changes encoder


class Retriever:
    def __init__(
        self,
        engine: Engine,
        data_dir: Path,
        count_tokens: Callable[[str], int],
        encoders: Sequence[Encoder] = (),
    ):
        """`encoders` replace the built-in ones of the same names (benchmarks use it)."""
        if not inspect(engine).has_table(paragraphs.name):
            raise RuntimeError("the retrieval tables are missing: run the migrations (alembic upgrade head)")
        self.engine = engine
        self.snapshot_dir = Path(data_dir) / "retrieval-index"
        self.snapshot_dir.mkdir(parents=True, exist_ok=True)
        self.count_tokens = count_tokens
        self.encoders = {name: make() for name, make in ENCODERS.items()} | {e.name: e for e in encoders}
        self._indexes: dict[str, CollectionIndex] = {}
        self._re_embedding: set[str] = set()  # collections whose paragraphs change encoder now
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
                store.delete_collection_row(conn, collection)
            self._indexes.pop(collection, None)
            self._snapshot_path(collection).unlink(missing_ok=True)
        return len(document_ids)

    def list_documents(self, collection: str) -> list[Document]:
        with self.engine.connect() as conn:
            return store.list_documents(conn, collection)

    def encoder_of(self, collection: str) -> str | None:
        """The encoder of the collection's embeddings; None until it is named or gets a document."""
        with self.engine.connect() as conn:
            return store.collection_encoder(conn, collection)

    def collections_by_encoder(self) -> dict[str, int]:
        """How many collections each encoder serves (the admin's overview)."""
        with self.engine.connect() as conn:
            return store.collections_by_encoder(conn)

    def set_encoder(
        self, collection: str, name: str, progress: Callable[[int, int], None] | None = None
    ) -> None:
        """Names the collection's encoder.  Paragraphs made by another are embedded again (slow:
        progress(done, total) after each batch); until that is done, searches use the old vectors and
        uploads to the collection are refused."""
        _check_collection(collection)
        encoder = self._encoder(name)
        with self._lock:
            if collection in self._re_embedding:
                raise ValueError(f"{collection} is being embedded again already")
            old = self._collection(collection)  # searches use it until the new vectors are in
            with self.engine.begin() as conn:
                store.set_collection_encoder(conn, collection, name)
            self._re_embedding.add(collection)
        try:
            self._embed_stale(collection, encoder, progress)
        finally:
            with self._lock:
                self._re_embedding.discard(collection)
                if self._indexes.get(collection) is old and old.encoder is not encoder:
                    del self._indexes[collection]
                    self._snapshot_path(collection).unlink(missing_ok=True)

    def warm_up(self) -> None:
        """Loads every encoder's model, so the first question does not wait for it."""
        for encoder in self.encoders.values():
            encoder.encode_query("warm up")

    def search(
        self, query: str, collections: Sequence[str], k: int = 5, mode: Mode | str = Mode.HYBRID
    ) -> list[Hit]:
        """The k best paragraphs of the collections for the query, best first."""
        collections, mode = _check_search(query, collections, k, mode)
        with self._lock:
            indexes = [self._collection(collection) for collection in collections]
        query_vectors = None if mode == Mode.BM25 else _query_vectors(query, indexes)
        with self._lock:
            scored = rank(indexes, tokenize(query), query_vectors, k, mode)
        with self.engine.connect() as conn:
            rows = store.paragraph_rows(conn, [item.paragraph_id for item in scored])
        return [_hit(rows[item.paragraph_id], item) for item in scored if item.paragraph_id in rows]

    def build_context(
        self,
        query: str,
        collections: Sequence[str],
        recent_turns: Sequence[str],
        budget_tokens: int,
        only_documents: Mapping[str, Collection[str]] | None = None,
    ) -> Context:
        """Classifies the query's intent and assembles its window: recent turns and passages from the
        collections, never more than budget_tokens by the model's tokenizer.  recent_turns are rendered
        turns ("user: ..."), oldest first.  A collection named in only_documents offers only its documents
        of those names (a session's turns that the model no longer sees); with none, it is not searched."""
        collections, _ = _check_search(query, collections, 1, Mode.HYBRID)
        if budget_tokens < 1:
            raise ValueError(f"budget_tokens must be positive, got {budget_tokens}")
        only_documents = only_documents or {}
        collections = [c for c in collections if only_documents.get(c, True)]
        decision = classify(query, list(recent_turns))
        strategy = STRATEGIES[decision.intent]
        budget = max(1, int(budget_tokens * strategy.budget_share))
        with self._lock:
            indexes = {collection: self._collection(collection) for collection in collections}
        spans = self._intent_spans(indexes, decision.intent, query, list(recent_turns), only_documents)
        filled = fill(
            list(recent_turns),
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
        self, indexes: dict, intent: Intent, query: str, recent_turns: list[str], only_documents: Mapping
    ) -> list[Span]:
        """The candidate spans for the window: a summary's overview of each document, else the hits of the
        query's terms (and, for a follow-up, the rarest terms of the last turn)."""
        if not indexes:
            return []
        strategy = STRATEGIES[intent]
        expand = strategy.expand_with_last_turn and recent_turns
        summary = intent == Intent.SUMMARY
        search_text = f"{recent_turns[-1]}\n{query}" if expand else query
        query_vectors = None if summary else _query_vectors(search_text, indexes.values())  # outside the lock
        terms = tokenize(query)
        with self._lock, self.engine.connect() as conn:
            only = {c: store.paragraph_ids_named(conn, c, names) for c, names in only_documents.items()}
            if summary:
                return self._overview_spans(conn, list(indexes.values()), only)
            if expand:
                terms += _rarest_terms(recent_turns[-1], list(indexes.values()), set(terms))
            return self._hit_spans(conn, indexes, terms, query_vectors, strategy.max_hits, only)

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
        encoder = self._encoder_for_upload(collection, indexed_texts)
        vectors = encoder.encode_passages(indexed_texts)  # the slow part, outside the lock
        with self._lock:
            with self.engine.begin() as conn:
                changed = store.collection_encoder(conn, collection) != encoder.name
                if changed or collection in self._re_embedding:
                    raise IngestError(f"{name}: the collection changed encoder during the upload; try again")
                document, paragraph_ids = store.insert_document(
                    conn, collection, name, kind, num_bytes, segmentation, vectors, encoder.name
                )
            index = self._indexes.get(collection)  # not loaded: its next load reads these rows
            if index is not None and index.encoder is not encoder:  # loaded before the encoder was named
                del self._indexes[collection]
            elif index is not None:
                for paragraph_id, indexed, vector in zip(paragraph_ids, indexed_texts, vectors, strict=True):
                    index.add(paragraph_id, indexed, vector)
                self._save_if_due(index)
        return document

    def _encoder_for_upload(self, collection: str, texts: list[str]) -> Encoder:
        """The collection's encoder; the first upload to a collection without one names it by its text."""
        with self._lock, self.engine.begin() as conn:
            if collection in self._re_embedding:
                raise IngestError("the collection is being embedded by another encoder; try again later")
            name = store.collection_encoder(conn, collection)
            if name is None:
                name = encoder_for_text("\n".join(texts))
                store.set_collection_encoder(conn, collection, name)
        return self._encoder(name)

    def _encoder(self, name: str) -> Encoder:
        if name not in self.encoders:
            raise ValueError(f"unknown encoder {name!r}; known: {', '.join(self.encoders)}")
        return self.encoders[name]

    def _embed_stale(
        self, collection: str, encoder: Encoder, progress: Callable[[int, int], None] | None = None
    ) -> None:
        """Embeds again, by `encoder`, the paragraphs of the collection that another one made."""
        with self.engine.connect() as conn:
            stale = store.stale_paragraph_ids(conn, collection, encoder.name)
        for start in range(0, len(stale), EMBED_BATCH):
            with self.engine.connect() as conn:
                batch = list(store.paragraphs_to_index(conn, stale[start : start + EMBED_BATCH]))
            vectors = encoder.encode_passages([paragraph.indexed_text for paragraph in batch])
            with self.engine.begin() as conn:
                store.set_embeddings(conn, [paragraph.id for paragraph in batch], vectors, encoder.name)
            if progress is not None:
                progress(min(start + EMBED_BATCH, len(stale)), len(stale))

    def _collection(self, collection: str) -> CollectionIndex:
        if collection not in self._indexes:
            index = self._load(collection)
            self._save_if_due(index)
            self._indexes[collection] = index
        return self._indexes[collection]

    def _load(self, collection: str) -> CollectionIndex:
        """The snapshot, brought in step with the database; a fresh build when there is no snapshot."""
        path = self._snapshot_path(collection)
        with self.engine.connect() as conn:
            encoder = self._encoder(store.collection_encoder(conn, collection) or DEFAULT_ENCODER)
        if collection not in self._re_embedding:  # a change of encoder was cut short: finish it
            self._embed_stale(collection, encoder)
        index = CollectionIndex(collection, encoder)
        if path.exists():
            try:
                index = CollectionIndex.load(path, collection, encoder)
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
        self, conn, indexes: dict[str, CollectionIndex], terms, query_vectors, max_hits, only
    ) -> list[Span]:
        scored = rank(list(indexes.values()), terms, query_vectors, WINDOW_CANDIDATES, only=only)
        rows = store.paragraph_rows(conn, [item.paragraph_id for item in scored])
        candidates = [
            Candidate(rows[item.paragraph_id], number, item.score, item.similarity)
            for number, item in enumerate(scored, start=1)
        ]
        view = _QueryView(conn, indexes, query_vectors)
        return grow(select(candidates, max_hits), view, self.count_tokens)

    def _overview_spans(self, conn, indexes: list[CollectionIndex], only: dict[str, set[int]]) -> list[Span]:
        """Head and tail of the collections (oldest and newest paragraph), then key paragraphs, chosen
        among the paragraphs of each encoder in proportion to their number (vectors of two encoders
        cannot be compared)."""
        by_encoder = defaultdict(list)
        for index in indexes:
            by_encoder[index.encoder.name].append(index)
        groups = [_live_vectors(group, only) for group in by_encoder.values()]
        total = sum(len(ids) for ids, _ in groups)
        if not total:
            return []
        all_ids = np.concatenate([ids for ids, _ in groups])
        chosen = {int(all_ids.min()): "head", int(all_ids.max()): "tail"}
        for ids, vectors in groups:
            count = max(1, round(SUMMARY_KEY_PARAGRAPHS * len(ids) / total))
            for paragraph_id in key_paragraphs(ids, vectors, count):
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
        similarity=scored.similarity,
    )


def _query_vectors(text: str, indexes: Iterable[CollectionIndex]) -> dict[str, np.ndarray]:
    """The query embedded once by each encoder among the indexes'."""
    encoders = {index.encoder.name: index.encoder for index in indexes}
    return {name: encoder.encode_query(text) for name, encoder in encoders.items()}


def _live_vectors(indexes: list[CollectionIndex], only: dict[str, set[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Paragraph ids and vectors of the live slots of indexes of one encoder (only those offered)."""
    ids = np.concatenate([np.frombuffer(index.paragraph_ids, dtype=np.int64) for index in indexes])
    live = np.concatenate([np.frombuffer(index.postings.live, dtype=np.uint8) for index in indexes]) == 1
    live &= np.concatenate([offered(index, only.get(index.collection)) for index in indexes])
    return ids[live], np.concatenate([index.vectors for index in indexes])[live]


def _rarest_terms(text: str, indexes: list[CollectionIndex], exclude: set[str]) -> list[str]:
    """The latest turn's most specific words: what a follow-up like "why is that?" is about."""
    terms = set(tokenize(text)) - exclude
    frequency = {term: sum(index.postings.frequency(term) for index in indexes) for term in terms}
    return sorted((term for term in terms if frequency[term]), key=lambda term: (frequency[term], term))[
        :EXPANSION_TERMS
    ]


class _QueryView:
    """The documents around the hits, and how similar their paragraphs are to the query."""

    def __init__(self, conn, indexes: dict[str, CollectionIndex], query_vectors: dict[str, np.ndarray]):
        self.conn, self.indexes, self.query_vectors = conn, indexes, query_vectors

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
            similarities.append(index.similarity(row.id, self.query_vectors[index.encoder.name]))
        return similarities
