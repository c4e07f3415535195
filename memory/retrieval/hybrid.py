"""Keyword candidates re-scored semantically, fused with a dense top-k.

BM25 finds paragraphs that share the query's words; the embeddings find paraphrases that share none.  The
candidates of both lists are pooled, each gets both scores, and each score is standardised over the pool
(z-score) before a weighted sum.  Standardising keeps how far ahead a candidate is, which rank fusion
(RRF) throws away: on our FAQ set equal-weight RRF fell below the embeddings alone (see README).
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

import numpy as np

from memory.retrieval.collection_index import CollectionIndex
from memory.retrieval.inverted_index import bm25_scores

CANDIDATES_PER_LIST = 50
DENSE_WEIGHT = 0.75  # BM25 gets the rest; chosen on the dev sets, checked on a holdout (README, Retrieval)


class Mode(StrEnum):
    HYBRID = "hybrid"
    BM25 = "bm25"
    DENSE = "dense"


@dataclass
class Scored:
    paragraph_id: int
    score: float  # what the ranking is by: fused, BM25 or similarity, depending on the mode
    bm25: float
    similarity: float  # Encoder.similarity: the cosine on a scale common to every encoder


def rank(
    indexes: Sequence[CollectionIndex],
    query_terms: list[str],
    query_vectors: Mapping[str, np.ndarray] | None,
    k: int,
    mode: Mode = Mode.HYBRID,
    only: Mapping[str, set[int]] | None = None,
) -> list[Scored]:
    """The best `k` paragraphs of `indexes`, best first.  `query_vectors` holds the query embedded by each
    index's encoder, by encoder name; it may be None in BM25 mode.  A collection named in `only` offers
    only those paragraph ids."""
    if not indexes or k < 1:
        return []
    ids = np.concatenate([np.frombuffer(index.paragraph_ids, dtype=np.int64) for index in indexes])
    if not len(ids):
        return []
    bm25 = np.concatenate(bm25_scores([index.postings for index in indexes], query_terms))
    allowed = np.concatenate([offered(index, (only or {}).get(index.collection)) for index in indexes])
    bm25[~allowed] = 0
    if mode == Mode.BM25:
        return _top_by(bm25, bm25, None, ids, k, positive_only=True)
    similarity = np.concatenate([index.dense_scores(query_vectors[index.encoder.name]) for index in indexes])
    similarity[~allowed] = -np.inf
    if mode == Mode.DENSE:
        return _top_by(similarity, bm25, similarity, ids, k)
    pool = np.union1d(
        _top(bm25, CANDIDATES_PER_LIST, positive_only=True), _top(similarity, CANDIDATES_PER_LIST)
    )
    if not len(pool):
        return []
    fused = DENSE_WEIGHT * _standardised(similarity[pool]) + (1 - DENSE_WEIGHT) * _standardised(bm25[pool])
    scores = np.full(len(ids), -np.inf, dtype=np.float64)
    scores[pool] = fused
    return _top_by(scores, bm25, similarity, ids, k)


def offered(index: CollectionIndex, only: set[int] | None) -> np.ndarray:
    """Per slot of the index: may it be returned (all, unless `only` names the paragraph ids that may)."""
    ids = np.frombuffer(index.paragraph_ids, dtype=np.int64)
    return np.ones(len(ids), dtype=bool) if only is None else np.isin(ids, list(only))


def _top(scores: np.ndarray, k: int, positive_only: bool = False) -> np.ndarray:
    """Positions of the k highest scores (finite ones, and positive ones if asked), best first."""
    valid = np.flatnonzero(scores > 0) if positive_only else np.flatnonzero(np.isfinite(scores))
    if len(valid) > k:
        valid = valid[np.argpartition(-scores[valid], k - 1)[:k]]
    return valid[np.argsort(-scores[valid], kind="stable")]


def _standardised(scores: np.ndarray) -> np.ndarray:
    scores = scores.astype(np.float64)
    return (scores - scores.mean()) / (scores.std() + 1e-9)


def _top_by(
    scores: np.ndarray,
    bm25: np.ndarray,
    similarity: np.ndarray | None,
    ids: np.ndarray,
    k: int,
    positive_only: bool = False,
) -> list[Scored]:
    return [
        Scored(
            int(ids[position]),
            float(scores[position]),
            float(bm25[position]),
            float(similarity[position]) if similarity is not None else float("nan"),
        )
        for position in _top(scores, k, positive_only)
    ]
