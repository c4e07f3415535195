"""BM25 over an inverted index: a query touches only the postings of its terms.

One index per collection.  Paragraphs are added and removed incrementally; a removed paragraph's slot is
dead until `compact` drops it.  Corpus statistics (paragraph count, average length, document frequency) are
summed over the collections a query is scoped to, so the scores equal those of one index built over exactly
those collections, with no statistics leaking in from other users' collections.

Scores are Okapi BM25 with the Lucene idf, log(1 + (N - df + 0.5) / (df + 0.5)), which stays positive for
terms in more than half the paragraphs (rank_bm25's Okapi instead floors such idfs at a fraction of the
vocabulary's mean idf, which an incremental index cannot keep up to date cheaply).
"""

import math
from array import array
from collections import Counter
from collections.abc import Mapping, Sequence

import numpy as np

K1 = 1.5
B = 0.75


class InvertedIndex:
    def __init__(self):
        self.term_ids: dict[str, int] = {}
        self.postings: list[array] = []  # per term id: slots of the paragraphs that contain it
        self.counts: list[array] = []  # per term id: how often it occurs in each of those paragraphs
        self.document_frequency = array("i")  # per term id, live paragraphs only
        self.lengths = array("f")  # per slot: number of terms
        self.slot_terms: list[array] = []  # per slot: its term ids, to undo `add`
        self.live = bytearray()  # per slot: 1 until removed
        self.num_live = 0
        self.total_length = 0

    @property
    def num_slots(self) -> int:
        return len(self.live)

    def add(self, counts: Mapping[str, int]) -> int:
        slot = self.num_slots
        term_ids = array("i")
        for term, count in counts.items():
            term_id = self.term_ids.get(term)
            if term_id is None:
                term_id = self.term_ids[term] = len(self.postings)
                self.postings.append(array("i"))
                self.counts.append(array("f"))
                self.document_frequency.append(0)
            self.postings[term_id].append(slot)
            self.counts[term_id].append(count)
            self.document_frequency[term_id] += 1
            term_ids.append(term_id)
        length = sum(counts.values())
        self.lengths.append(length)
        self.slot_terms.append(term_ids)
        self.live.append(1)
        self.num_live += 1
        self.total_length += length
        return slot

    def remove(self, slot: int) -> None:
        if not self.live[slot]:
            raise ValueError(f"slot {slot} was already removed")
        for term_id in self.slot_terms[slot]:
            self.document_frequency[term_id] -= 1
        self.live[slot] = 0
        self.num_live -= 1
        self.total_length -= int(self.lengths[slot])
        self.slot_terms[slot] = array("i")

    def frequency(self, term: str) -> int:
        term_id = self.term_ids.get(term)
        return 0 if term_id is None else self.document_frequency[term_id]

    def accumulate(self, weights: Mapping[str, float], average_length: float) -> np.ndarray:
        """BM25 score of every slot (dead ones 0); `weights` maps each query term to idf x its query count."""
        scores = np.zeros(self.num_slots, dtype=np.float32)
        lengths = np.frombuffer(self.lengths, dtype=np.float32)
        for term, weight in weights.items():
            term_id = self.term_ids.get(term)
            if term_id is None:
                continue
            slots = np.frombuffer(self.postings[term_id], dtype=np.int32)
            counts = np.frombuffer(self.counts[term_id], dtype=np.float32)
            norm = K1 * (1 - B + B * lengths[slots] / average_length)
            scores[slots] += weight * counts * (K1 + 1) / (counts + norm)
        scores[np.frombuffer(self.live, dtype=np.uint8) == 0] = 0
        return scores

    def compact(self) -> np.ndarray:
        """Drops dead slots; returns the old slot of each new slot, for the caller's per-slot arrays."""
        keep = np.flatnonzero(np.frombuffer(self.live, dtype=np.uint8))
        new_slot = np.full(self.num_slots, -1, dtype=np.int32)
        new_slot[keep] = np.arange(len(keep), dtype=np.int32)
        for term_id, slots in enumerate(self.postings):
            old = np.frombuffer(slots, dtype=np.int32)
            alive = new_slot[old] >= 0
            self.postings[term_id] = array("i", new_slot[old[alive]].tobytes())
            self.counts[term_id] = array(
                "f", np.frombuffer(self.counts[term_id], np.float32)[alive].tobytes()
            )
        self.lengths = array("f", np.frombuffer(self.lengths, dtype=np.float32)[keep].tobytes())
        self.slot_terms = [self.slot_terms[slot] for slot in keep]
        self.live = bytearray(b"\x01" * len(keep))
        return keep


def bm25_scores(indexes: Sequence[InvertedIndex], query_terms: list[str]) -> list[np.ndarray]:
    """Scores per index, with statistics taken over all of `indexes` together."""
    num_docs = sum(index.num_live for index in indexes)
    if num_docs == 0:
        return [np.zeros(index.num_slots, dtype=np.float32) for index in indexes]
    average_length = max(sum(index.total_length for index in indexes) / num_docs, 1e-9)
    weights = {}
    for term, query_count in Counter(query_terms).items():
        frequency = sum(index.frequency(term) for index in indexes)
        if frequency:
            weights[term] = query_count * math.log(1 + (num_docs - frequency + 0.5) / (frequency + 0.5))
    return [index.accumulate(weights, average_length) for index in indexes]
