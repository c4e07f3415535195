"""The retriever's queries on Postgres, the chat service's other database (SQLite is used everywhere else)."""

import uuid

import psycopg
from sqlalchemy import create_engine

from memory.retrieval import Retriever
from memory.retrieval.tables import metadata
from tests.chatsvc.conftest import postgres_url  # noqa: F401 (the throwaway cluster fixture)

GUIDE = """# Permits

A building permit takes ten weeks.

Fees:

The fee is about 25,000 SEK.

# Radon

Measure radon in winter.
"""


def test_add_search_window_delete_and_restart_on_postgres(postgres_url, tmp_path, count_tokens):  # noqa: F811
    name = f"test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_url.replace("+psycopg", "") + "/postgres", autocommit=True) as connection:
        connection.execute(f"CREATE DATABASE {name}")
    engine = create_engine(f"{postgres_url}/{name}")
    metadata.create_all(engine)
    retriever = Retriever(engine, tmp_path, count_tokens)
    guide = retriever.add_document("kb:1", "guide.md", GUIDE)
    turn = retriever.add_turn("session:1", "turn 0 (user)", "My flight number is LX318.")
    assert retriever.search("permit fee", ["kb:1"], k=1)[0].document_id == guide.id
    context = retriever.build_context("what does the permit cost?", ["kb:1", "session:1"], [], 200)
    assert "25,000 SEK" in context.text and context.num_tokens <= context.budget_tokens
    retriever.delete_document(turn.id)
    restarted = Retriever(engine, tmp_path / "fresh", count_tokens)
    assert [document.name for document in restarted.list_documents("kb:1")] == ["guide.md"]
    assert restarted.search("flight number", ["session:1"]) == []
    assert restarted.search("radon", ["kb:1"], k=1)[0].heading == "Radon"
    engine.dispose()
