import random
from collections import Counter

import numpy as np
import pytest

from memory.retrieval.bm25_reference import LuceneIdfBM25
from memory.retrieval.collection_index import CollectionIndex
from memory.retrieval.embeddings import MiniLM, MultilingualE5
from memory.retrieval.inverted_index import InvertedIndex, bm25_scores
from memory.retrieval.tokenize import tokenize


@pytest.fixture(scope="module")
def corpus(faq_items) -> list[list[str]]:
    chinese = ["建筑许可证需要十周。", "热泵在冬天节省能源。", "建筑许可的费用按照市政标准计算。"]
    return [tokenize(item["a"]) for item in faq_items[:150]] + [tokenize(text) for text in chinese]


@pytest.fixture(scope="module")
def queries(faq_items) -> list[list[str]]:
    return [tokenize(item["q"]) for item in faq_items[:150:5]] + [tokenize("建筑许可要多久"), ["the"]]


def build(documents: list[list[str]]) -> InvertedIndex:
    index = InvertedIndex()
    for terms in documents:
        index.add(Counter(terms))
    return index


def test_scores_match_rank_bm25(corpus, queries):
    oracle, index = LuceneIdfBM25(corpus), build(corpus)
    for query in queries:
        expected = oracle.get_scores(query)
        assert np.allclose(bm25_scores([index], query)[0], expected, rtol=1e-5, atol=1e-5)
    assert bm25_scores([index], tokenize("建筑许可要多久"))[0][-3:].argmax() in (0, 2)


def test_scores_over_several_indexes_equal_one_index_over_all(corpus, queries):
    oracle, parts = LuceneIdfBM25(corpus), [build(corpus[:40]), build(corpus[40:])]
    for query in queries:
        assert np.allclose(np.concatenate(bm25_scores(parts, query)), oracle.get_scores(query), atol=1e-5)


def scores_by_id(index: CollectionIndex, query: list[str]) -> dict[int, float]:
    scores = bm25_scores([index.postings], query)[0]
    return {paragraph_id: float(scores[slot]) for paragraph_id, slot in index.slot_of.items()}


def test_incremental_add_and_delete_equal_a_fresh_build(corpus, queries, tmp_path):
    rng = random.Random(0)
    vectors = np.random.default_rng(0).standard_normal((len(corpus), 384)).astype(np.float32)
    incremental, kept = CollectionIndex("kb:1", MiniLM()), set()
    for step in range(3):
        for paragraph_id in range(step * 50, min(len(corpus), step * 50 + 80)):
            if paragraph_id not in kept:
                incremental.add(paragraph_id, " ".join(corpus[paragraph_id]), vectors[paragraph_id])
                kept.add(paragraph_id)
        for paragraph_id in rng.sample(sorted(kept), 45):  # more than half at times: compaction runs too
            incremental.remove(paragraph_id)
            kept.discard(paragraph_id)
    fresh = CollectionIndex("kb:1", MiniLM())
    for paragraph_id in sorted(kept):
        fresh.add(paragraph_id, " ".join(corpus[paragraph_id]), vectors[paragraph_id])
    incremental.save(tmp_path / "snapshot.npz")
    reloaded = CollectionIndex.load(tmp_path / "snapshot.npz", "kb:1", MiniLM())
    for query in queries:
        expected = scores_by_id(fresh, query)
        assert scores_by_id(incremental, query) == pytest.approx(expected, abs=1e-5)
        assert scores_by_id(reloaded, query) == pytest.approx(expected, abs=1e-5)
    for index in (incremental, reloaded):
        dense = index.dense_scores(vectors[0])
        assert {pid: float(dense[slot]) for pid, slot in index.slot_of.items()} == pytest.approx(
            {pid: float(vectors[pid] @ vectors[0]) for pid in kept}, abs=1e-4
        )


def test_removed_paragraphs_score_nothing_and_stats_follow():
    index = build([["permit", "fee"], ["permit"], ["heat", "pump"]])
    index.remove(0)
    assert index.frequency("permit") == 1 and index.num_live == 2 and index.total_length == 3
    assert bm25_scores([index], ["fee"])[0].tolist() == [0, 0, 0]
    with pytest.raises(ValueError, match="already removed"):
        index.remove(0)


def test_snapshot_of_another_collection_or_encoder_is_refused(tmp_path):
    index = CollectionIndex("kb:1", MiniLM())
    index.add(7, "heat pump", np.ones(384, dtype=np.float32))
    index.save(tmp_path / "a.npz")
    with pytest.raises(ValueError, match="not a version 2 snapshot of 'kb:2'"):
        CollectionIndex.load(tmp_path / "a.npz", "kb:2", MiniLM())
    with pytest.raises(ValueError, match="another encoder than multilingual-e5-small"):
        CollectionIndex.load(tmp_path / "a.npz", "kb:1", MultilingualE5())


def test_mixed_chinese_and_english_text_becomes_characters_bigrams_and_stemmed_words():
    assert tokenize("NFC刷不了，iPhone 15的电池") == [
        "nfc", "刷", "不", "了", "刷不", "不了", "iphon", "15", "的", "电", "池", "的电", "电池"
    ]  # fmt: skip
    assert tokenize("ＮＦＣ（近场通信）") == tokenize("NFC(近场通信)")  # full-width forms fold to ASCII
