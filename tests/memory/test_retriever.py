import pytest
from sqlalchemy import create_engine

from memory.retrieval import IngestError, Retriever

PERMITS = """# Building permits

A building permit is a decision by the municipal building committee that allows you to build.

Processing takes ten weeks by law, twenty for complex cases.

# Heating

A ground source heat pump draws warmth from a borehole and cuts heating bills in winter.
"""

CHINESE = """# 建筑许可

建筑许可证的审批需要十周，复杂的情况可以延长到二十周。

# 供暖

地源热泵从钻孔中获取热量，冬天可以降低供暖费用。
"""


def texts(hits) -> list[str]:
    return [hit.text for hit in hits]


def test_search_finds_keywords_and_paraphrases_with_citation_fields(make_retriever):
    retriever = make_retriever()
    document = retriever.add_document("kb:1", "permits.md", PERMITS)
    assert (document.name, document.kind, document.num_paragraphs) == ("permits.md", "markdown", 3)
    hit = retriever.search("how many weeks does the permit take", ["kb:1"], k=1)[0]
    assert hit.text.startswith("Processing takes ten weeks")
    assert (hit.document_id, hit.document_name, hit.heading, hit.position) == (
        document.id,
        "permits.md",
        "Building permits",
        1,
    )
    assert hit.bm25 > 0 and hit.similarity > 0
    # No word shared with the paragraph: only the embeddings can find it.
    paraphrase = retriever.search(
        "cheaper ways to keep my house warm when it is cold", ["kb:1"], k=1, mode="dense"
    )
    assert paraphrase[0].text.startswith("A ground source heat pump")
    assert (
        retriever.search("cheaper ways to keep my house warm when it is cold", ["kb:1"], k=1)[0].position == 2
    )


def test_chinese_documents_are_searchable(make_retriever):
    retriever = make_retriever()
    retriever.add_document("kb:zh", "guide.md", CHINESE)
    for mode in ("bm25", "hybrid"):
        assert retriever.search("审批需要多长时间", ["kb:zh"], k=1, mode=mode)[0].text.startswith(
            "建筑许可证"
        )
        assert retriever.search("热泵", ["kb:zh"], k=1, mode=mode)[0].text.startswith("地源热泵")


def test_collections_scope_the_search(make_retriever):
    retriever = make_retriever()
    retriever.add_document("kb:1", "permits.md", PERMITS)
    retriever.add_document("kb:2", "other.txt", "Building permits in Norway take three weeks.")
    assert {hit.collection for hit in retriever.search("building permit weeks", ["kb:2"], k=5)} == {"kb:2"}
    assert {hit.collection for hit in retriever.search("building permit weeks", ["kb:1", "kb:2"], k=5)} == {
        "kb:1",
        "kb:2",
    }
    assert retriever.search("building permit", ["kb:empty"], k=5) == []


def test_unreadable_and_oversized_files_are_rejected_while_the_others_go_in(make_retriever):
    retriever = make_retriever()
    result = retriever.add_documents(
        "kb:1",
        [
            ("permits.md", PERMITS.encode()),
            ("scan.pdf", b"%PDF-1.7 broken"),
            ("huge.txt", b"x" * (20 * 2**20 + 1)),
            ("photo.jpg", b"\xff\xd8\xff"),
            ("guide.md", CHINESE.encode()),
        ],
    )
    assert [document.name for document in result.added] == ["permits.md", "guide.md"]
    reasons = {rejected.name: rejected.reason for rejected in result.rejected}
    assert "not a readable PDF" in reasons["scan.pdf"]
    assert "over the 20 MiB limit" in reasons["huge.txt"]
    assert "unsupported file type .jpg" in reasons["photo.jpg"]
    assert [document.name for document in retriever.list_documents("kb:1")] == ["permits.md", "guide.md"]
    with pytest.raises(IngestError, match=r"scan\.pdf"):
        retriever.add_document("kb:1", "scan.pdf", b"%PDF-1.7 broken")


@pytest.mark.parametrize("close_first", [False, True], ids=["from-database", "from-snapshot"])
def test_index_survives_a_restart_and_keeps_changes(make_retriever, close_first):
    first = make_retriever()
    keep = first.add_document("kb:1", "permits.md", PERMITS)
    gone = first.add_document("kb:1", "other.txt", "Building permits in Norway take three weeks.")
    before = first.search("building permit weeks", ["kb:1"], k=5)
    if close_first:
        first.close()
    first.delete_document(gone.id)  # after the snapshot: the next start must notice
    second = make_retriever()
    assert [document.id for document in second.list_documents("kb:1")] == [keep.id]
    after = second.search("building permit weeks", ["kb:1"], k=5)
    assert "Building permits in Norway take three weeks." in texts(before)
    assert "Building permits in Norway take three weeks." not in texts(after)
    # Same scores as the instance that saw every change happen.
    assert [(hit.paragraph_id, round(hit.score, 4)) for hit in after] == [
        (hit.paragraph_id, round(hit.score, 4))
        for hit in first.search("building permit weeks", ["kb:1"], k=5)
    ]


def test_delete_collection_forgets_everything(make_retriever):
    retriever = make_retriever()
    retriever.add_turn("session:1", "turn 0 (user)", "My flight is LX318 on Friday.")
    retriever.search("flight", ["session:1"])
    retriever.close()
    assert retriever.delete_collection("session:1") == 1
    assert retriever.search("flight", ["session:1"]) == []
    assert make_retriever().search("flight", ["session:1"]) == []


@pytest.mark.filterwarnings("error")
@pytest.mark.parametrize("mode", ["bm25", "dense", "hybrid"])
def test_a_collection_whose_documents_were_all_deleted_finds_nothing(make_retriever, mode):
    retriever = make_retriever()
    document = retriever.add_document("kb:1", "permits.md", PERMITS)
    assert retriever.search("building permit weeks", ["kb:1"], mode=mode)
    retriever.delete_document(document.id)  # its slots stay in the loaded index, dead
    assert retriever.search("building permit weeks", ["kb:1"], mode=mode) == []


def test_caller_mistakes_raise_value_errors(make_retriever, tmp_path, count_tokens):
    retriever = make_retriever()
    with pytest.raises(ValueError, match="query is empty"):
        retriever.search("  ", ["kb:1"])
    with pytest.raises(ValueError, match="k must be between 1 and 100"):
        retriever.search("permit", ["kb:1"], k=0)
    with pytest.raises(ValueError, match="mode must be one of"):
        retriever.search("permit", ["kb:1"], mode="fuzzy")
    with pytest.raises(ValueError, match="at least one collection"):
        retriever.search("permit", [])
    with pytest.raises(IngestError, match="a document name is 1 to 512 characters, got 600"):
        retriever.add_document("kb:1", "x" * 596 + ".txt", "text")
    with pytest.raises(ValueError, match="no document with id 999"):
        retriever.delete_document(999)
    with pytest.raises(RuntimeError, match="run the migrations"):
        Retriever(create_engine(f"sqlite:///{tmp_path / 'empty.sqlite'}"), tmp_path, count_tokens)
