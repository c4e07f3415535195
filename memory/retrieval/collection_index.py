"""The in-memory index of one collection: paragraph ids, BM25 postings and the embedding matrix, by slot.

The database is the source of truth; a snapshot file (plain .npz arrays, no pickle) only makes restarts
fast.  The retriever reconciles a loaded snapshot with the database, so a stale one is still correct.
"""

import itertools
import os
from array import array
from pathlib import Path

import numpy as np

from memory.retrieval.embeddings import DIMENSION, Encoder
from memory.retrieval.inverted_index import InvertedIndex
from memory.retrieval.tokenize import term_counts

SNAPSHOT_VERSION = 2


class CollectionIndex:
    def __init__(self, collection: str, encoder: Encoder):
        self.collection = collection
        self.encoder = encoder  # what made the vectors, and what embeds a query for them
        self.postings = InvertedIndex()
        self.paragraph_ids = array("q")  # per slot
        self.slot_of: dict[int, int] = {}  # live paragraph id -> slot
        self._vectors = np.zeros((16, DIMENSION), dtype=np.float32)
        self.unsaved_changes = 0

    def __len__(self) -> int:
        return len(self.slot_of)

    @property
    def vectors(self) -> np.ndarray:
        return self._vectors[: self.postings.num_slots]

    def add(self, paragraph_id: int, indexed_text: str, vector: np.ndarray) -> None:
        slot = self.postings.add(term_counts(indexed_text))
        if slot == len(self._vectors):
            self._vectors = np.concatenate([self._vectors, np.zeros_like(self._vectors)])
        self._vectors[slot] = vector
        self.paragraph_ids.append(paragraph_id)
        self.slot_of[paragraph_id] = slot
        self.unsaved_changes += 1

    def remove(self, paragraph_id: int) -> None:
        slot = self.slot_of.pop(paragraph_id)
        self.postings.remove(slot)
        self._vectors[slot] = 0
        self.unsaved_changes += 1
        if self.postings.num_slots > 64 and len(self) < self.postings.num_slots // 2:
            self.compact()

    def dense_scores(self, query_vector: np.ndarray) -> np.ndarray:
        """Similarity of every slot to a query vector of this index's encoder, on the common scale
        (Encoder.similarity); dead slots get -inf."""
        scores = self.encoder.similarity(self.vectors @ query_vector)
        scores[np.frombuffer(self.postings.live, dtype=np.uint8) == 0] = -np.inf
        return scores

    def similarity(self, paragraph_id: int, query_vector: np.ndarray) -> float:
        """dense_scores of one live paragraph."""
        return float(self.encoder.similarity(self.vectors[self.slot_of[paragraph_id]] @ query_vector))

    def compact(self) -> None:
        vectors = self.vectors
        keep = self.postings.compact()
        self._vectors = vectors[keep].copy() if len(keep) else np.zeros((16, DIMENSION), np.float32)
        self.paragraph_ids = array("q", np.frombuffer(self.paragraph_ids, dtype=np.int64)[keep].tobytes())
        self.slot_of = {int(paragraph_id): slot for slot, paragraph_id in enumerate(self.paragraph_ids)}

    def save(self, path: Path) -> None:
        self.compact()
        index = self.postings
        vocabulary = list(index.term_ids)
        offsets = np.cumsum([0] + [len(slots) for slots in index.postings], dtype=np.int64)
        partial = path.with_name(path.name + ".partial.npz")
        np.savez(
            partial,
            version=np.array([SNAPSHOT_VERSION]),
            collection=np.frombuffer(self.collection.encode(), dtype=np.uint8),
            encoder=np.frombuffer(self.encoder.name.encode(), dtype=np.uint8),
            paragraph_ids=np.frombuffer(self.paragraph_ids, dtype=np.int64),
            vectors=self.vectors,
            lengths=np.frombuffer(index.lengths, dtype=np.float32),
            vocabulary=np.frombuffer("\n".join(vocabulary).encode(), dtype=np.uint8),
            term_offsets=offsets,
            slots=_concatenate(index.postings, np.int32),
            counts=_concatenate(index.counts, np.float32),
        )
        os.replace(partial, path)  # atomic: a crash never leaves a half-written snapshot
        self.unsaved_changes = 0

    @classmethod
    def load(cls, path: Path, collection: str, encoder: Encoder) -> "CollectionIndex":
        """Raises ValueError when the file is not a snapshot of this collection, in this format, with
        vectors of this encoder."""
        with np.load(path, allow_pickle=False) as arrays:
            saved = {name: arrays[name] for name in arrays.files}
        if int(saved["version"][0]) != SNAPSHOT_VERSION or bytes(saved["collection"]).decode() != collection:
            raise ValueError(f"{path} is not a version {SNAPSHOT_VERSION} snapshot of {collection!r}")
        if bytes(saved["encoder"]).decode() != encoder.name:
            raise ValueError(f"{path} holds vectors of another encoder than {encoder.name}")
        self = cls(collection, encoder)
        self._vectors = saved["vectors"].copy() if len(saved["vectors"]) else self._vectors
        self.paragraph_ids = array("q", saved["paragraph_ids"].tobytes())
        self.slot_of = {int(paragraph_id): slot for slot, paragraph_id in enumerate(self.paragraph_ids)}
        _restore_postings(self.postings, saved)
        return self


def _concatenate(arrays: list[array], dtype) -> np.ndarray:
    if not arrays:
        return np.zeros(0, dtype=dtype)
    return np.concatenate([np.frombuffer(values, dtype=dtype) for values in arrays])


def _restore_postings(index: InvertedIndex, saved: dict[str, np.ndarray]) -> None:
    vocabulary = bytes(saved["vocabulary"]).decode().split("\n") if len(saved["vocabulary"]) else []
    offsets, slots, counts = saved["term_offsets"], saved["slots"], saved["counts"]
    index.term_ids = {term: term_id for term_id, term in enumerate(vocabulary)}
    index.postings = [array("i", slots[a:b].tobytes()) for a, b in itertools.pairwise(offsets)]
    index.counts = [array("f", counts[a:b].tobytes()) for a, b in itertools.pairwise(offsets)]
    index.document_frequency = array("i", np.diff(offsets).astype(np.int32).tobytes())
    index.lengths = array("f", saved["lengths"].tobytes())
    num_slots = len(saved["lengths"])
    # Invert the postings (term -> slots) into each slot's term ids, which `remove` needs.
    term_of_posting = np.repeat(np.arange(len(vocabulary), dtype=np.int32), np.diff(offsets))
    order = np.argsort(slots, kind="stable")
    bounds = np.cumsum(np.bincount(slots, minlength=num_slots))[:-1] if num_slots else []
    index.slot_terms = [array("i", part.tobytes()) for part in np.split(term_of_posting[order], bounds)]
    index.slot_terms = index.slot_terms[:num_slots]
    index.live = bytearray(b"\x01" * num_slots)
    index.num_live = num_slots
    index.total_length = int(saved["lengths"].sum())
