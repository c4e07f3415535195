import pytest
from sqlalchemy import create_engine

from memory.retrieval import Retriever
from memory.retrieval.tables import metadata

GUIDE = """# Permits

A building permit is a decision by the municipal building committee that allows you to build.

Processing takes ten weeks by law, twenty weeks for complex cases.

Fees:

The permit fee follows the municipal tariff, about 25,000 SEK for a single-family house.

# Heating

A ground source heat pump draws warmth from a borehole and cuts heating bills in winter.

District heating has a monthly fee but no investment.

# Radon

Radon gas from the ground must be measured in winter over two months.

The reference level for radon in homes is 200 becquerel per cubic metre.

Radon can be lowered with a radon well or better ventilation of the crawl space.
"""


@pytest.fixture(scope="module")
def retriever(tmp_path_factory, count_tokens, faq_items):
    """Built once for the module: the tests only read it."""
    folder = tmp_path_factory.mktemp("context")
    engine = create_engine(f"sqlite:///{folder / 'app.sqlite'}")
    metadata.create_all(engine)
    retriever = Retriever(engine, folder, count_tokens)
    retriever.add_document("kb:1", "guide.md", GUIDE)
    retriever.add_document("kb:2", "renovation.md", RENOVATION)
    answers = "\n\n".join(item["a"] for item in faq_items[:FAQ_ANSWERS])
    retriever.add_document("kb:1", "faq.md", f"# Permits and deductions\n\n{answers}")
    for number in range(NUM_TURNS):
        text = f"user: we talked about garden furniture and paint colours, part {number}"
        if number == 3:
            text = "user: My flight number is LX318 and I land in Zurich on Friday."
        retriever.add_turn("session:1", f"turn {number} (user)", text)
    return retriever


FAQ_ANSWERS = 12
NUM_TURNS = 12  # the fact is in turn 3; the recent turns are the last 4

RENOVATION = """# Renovation

Painting the walls takes two days per room.

Tiles in a shower are laid on a waterproof membrane.

Costs:

A kitchen renovation costs 150,000 SEK on average.

Electrical work must be done by an authorised electrician.

Windows are replaced about every 40 years.
"""

RECENT = [
    f"user: we talked about garden furniture and paint colours, part {number}"
    for number in range(NUM_TURNS - 4, NUM_TURNS)
]
QUERIES = [
    ("How much is the fee for a building permit?", [], "knowledge"),
    ("What was my flight number again?", RECENT, "fact_check"),
    ("Why is that?", ["assistant: District heating has a monthly fee but no investment."], "follow_up"),
    ("Summarize the guide", [], "summary"),
]


@pytest.mark.parametrize("budget", [12, 40, 100, 300, 1000])
@pytest.mark.parametrize(("query", "recent", "intent"), QUERIES)
def test_context_never_exceeds_its_budget(retriever, count_tokens, budget, query, recent, intent):
    context = retriever.build_context(query, ["kb:1", "session:1"], recent, budget)
    assert context.intent == intent
    assert context.budget_tokens <= budget
    assert context.num_tokens == count_tokens(context.text) <= context.budget_tokens
    assert all(passage.num_tokens == count_tokens(passage.text) for passage in context.passages)
    if budget >= 300:
        assert context.passages


def test_an_evicted_fact_comes_back_from_the_session_index(retriever):
    context = retriever.build_context("What was my flight number again?", ["session:1"], RECENT, 400)
    assert "LX318" in context.text
    assert context.passages[0].document_name == "turn 3 (user)"


def test_only_the_turns_named_are_offered_and_none_leaves_the_collection_out(retriever):
    question = "What was my flight number again?"
    context = retriever.build_context(question, ["session:1"], RECENT, 400, {"session:1": {"turn 5 (user)"}})
    assert {passage.document_name for passage in context.passages} == {"turn 5 (user)"}
    for intent_query in (question, "Summarise our chat"):
        context = retriever.build_context(
            intent_query, ["kb:1", "session:1"], RECENT, 400, {"session:1": set()}
        )
        assert context.passages and {p.collection for p in context.passages} == {"kb:1"}


def test_a_section_whose_paragraphs_mostly_hit_is_taken_whole(retriever):
    context = retriever.build_context("radon gas level measurement well", ["kb:1"], [], 2000)
    radon = next(passage for passage in context.passages if passage.heading == "Radon")
    assert radon.reason == "section" and radon.positions == [6, 7, 8]


def test_a_short_hit_is_read_with_the_paragraph_it_introduces(retriever):
    context = retriever.build_context("what are the costs?", ["kb:2"], [], 2000)
    costs = next(passage for passage in context.passages if "Costs:" in passage.text)
    assert costs.reason == "neighbours" and "150,000 SEK" in costs.text


def test_a_summary_loads_head_tail_and_key_paragraphs_in_document_order(retriever):
    context = retriever.build_context("Give me an overview", ["kb:1"], [], 1000)
    reasons = [passage.reason for passage in context.passages]
    assert reasons[0] == "head" and reasons[-1] == "tail" and "key" in reasons
    order = [(passage.document_id, passage.positions[0]) for passage in context.passages]
    assert order == sorted(order)


def test_a_tight_budget_trims_to_whole_sentences(retriever, faq_items):
    query = "What is the statutory processing time for a building permit and when can it be extended?"
    context = retriever.build_context(query, ["kb:1"], [], 100)
    trimmed = [passage for passage in context.passages if passage.reason == "trimmed"]
    assert trimmed and context.num_tokens <= context.budget_tokens == 50
    answers = [item["a"] for item in faq_items[:FAQ_ANSWERS]]
    assert any(
        answer.startswith(trimmed[0].text) and len(answer) > len(trimmed[0].text) for answer in answers
    )
    assert trimmed[0].text.endswith(".")
