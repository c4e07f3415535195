"""Each collection's embeddings come from one encoder, named in the database and never mixed in a search."""

import numpy as np
import pytest
from sqlalchemy import select, update

from memory.retrieval import IngestError, store
from memory.retrieval.embeddings import MiniLM, MultilingualE5, encoder_for_text
from memory.retrieval.tables import paragraphs

ENGLISH = """# Returns

Items can be sent back within seven days of delivery for a full refund.

# Warranty

The watch is covered for two years against defects in materials and workmanship.
"""

CHINESE = """# 退货

商品签收后七天内可以无理由退货，退款原路返回。

# 保修

智能手表享受两年保修，耳机为一年。
"""


def test_the_script_of_the_text_names_the_encoder():
    assert encoder_for_text("Items can be sent back within seven days.") == "minilm"
    assert encoder_for_text("商品签收后七天内可以无理由退货") == "multilingual-e5-small"
    assert encoder_for_text("iPhone 15 Pro 的保修期多长？") == "multilingual-e5-small"
    assert encoder_for_text("What does 退货 mean for my order?") == "minilm"


def test_query_vectors_of_both_encoders_are_unit_length_and_on_one_scale():
    for encoder in (MiniLM(), MultilingualE5()):
        query = encoder.encode_query("how long is the warranty")
        passages = encoder.encode_passages(["The warranty lasts two years.", "Bananas are yellow."])
        assert np.allclose(np.linalg.norm(passages, axis=1), 1, atol=1e-3)
        related, unrelated = encoder.similarity(passages @ query)
        assert related > unrelated and -0.5 < unrelated < 0.5, encoder.name


def test_first_document_names_the_encoder_and_search_spans_both(make_retriever):
    retriever = make_retriever()
    assert retriever.encoder_of("kb:en") is None
    retriever.add_document("kb:en", "policy.md", ENGLISH)
    retriever.add_document("kb:zh", "政策.md", CHINESE)
    assert retriever.encoder_of("kb:en") == "minilm"
    assert retriever.encoder_of("kb:zh") == "multilingual-e5-small"
    retriever.add_document("kb:zh", "english.md", ENGLISH)  # later documents keep the collection's
    assert retriever.encoder_of("kb:zh") == "multilingual-e5-small"
    hits = retriever.search("耳机保修多久", ["kb:en", "kb:zh"], k=1, mode="dense")
    assert hits[0].text.startswith("智能手表享受两年保修")
    hits = retriever.search("how long is the watch guaranteed", ["kb:en", "kb:zh"], k=2, mode="hybrid")
    assert {hit.text[:20] for hit in hits} == {"The watch is covered"}


def test_changing_the_encoder_embeds_every_paragraph_again_with_progress(make_retriever, database):
    retriever = make_retriever()
    retriever.add_document("kb:1", "policy.md", ENGLISH)
    retriever.search("refund", ["kb:1"])  # loaded: searches use it while the new vectors are made
    progress = []
    retriever.set_encoder("kb:1", "multilingual-e5-small", lambda done, total: progress.append((done, total)))
    assert progress == [(2, 2)]
    assert retriever.encoder_of("kb:1") == "multilingual-e5-small"
    with database.connect() as conn:
        assert set(conn.scalars(select(paragraphs.c.encoder))) == {"multilingual-e5-small"}
    assert retriever.search("退款", ["kb:1"], k=1, mode="dense")[0].text.startswith("Items can be sent")
    retriever.close()
    restarted = make_retriever()  # the snapshot holds the new vectors
    assert restarted.search("guarantee", ["kb:1"], k=1, mode="dense")[0].text.startswith("The watch")


def test_uploads_wait_for_a_change_of_encoder(make_retriever):
    retriever = make_retriever()
    retriever.add_document("kb:1", "policy.md", ENGLISH)
    refused = []

    def upload_meanwhile(done, total):
        with pytest.raises(IngestError, match="try again later"):
            retriever.add_document("kb:1", "more.md", CHINESE)
        refused.append(done)

    retriever.set_encoder("kb:1", "multilingual-e5-small", upload_meanwhile)
    assert refused and retriever.add_document("kb:1", "more.md", CHINESE).num_paragraphs == 2
    with pytest.raises(ValueError, match="unknown encoder 'bert'"):
        retriever.set_encoder("kb:1", "bert")


def test_a_change_cut_short_is_finished_before_the_next_search(make_retriever, database):
    retriever = make_retriever()
    retriever.add_document("kb:1", "policy.md", ENGLISH)
    retriever.close()
    # As if the server stopped after naming the new encoder and before embedding anything again.
    with database.begin() as conn:
        store.set_collection_encoder(conn, "kb:1", "multilingual-e5-small")
        conn.execute(update(paragraphs).values(embedding=np.zeros(384, np.float32).tobytes()))
    restarted = make_retriever()
    assert restarted.search("保修", ["kb:1"], k=1, mode="dense")[0].text.startswith("The watch is covered")
    with database.connect() as conn:
        assert set(conn.scalars(select(paragraphs.c.encoder))) == {"multilingual-e5-small"}
