import importlib.resources
import json

import pytest
from sqlalchemy import create_engine, event
from transformers import AutoTokenizer

from memory.retrieval import Retriever
from memory.retrieval.tables import metadata


@pytest.fixture(scope="session")
def count_tokens(smollm2_dir):
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    return lambda text: len(tokenizer.encode(text, add_special_tokens=False))


def _foreign_keys_on(dbapi_connection, connection_record):
    dbapi_connection.execute("PRAGMA foreign_keys=ON")  # as the chat service's engine does


@pytest.fixture
def database(tmp_path):
    engine = create_engine(f"sqlite:///{tmp_path / 'app.sqlite'}")
    event.listen(engine, "connect", _foreign_keys_on)
    metadata.create_all(engine)
    yield engine
    engine.dispose()


@pytest.fixture
def make_retriever(database, tmp_path, count_tokens):
    """A new Retriever over the same database and data folder each call, as after a restart."""
    return lambda: Retriever(database, tmp_path / "data", count_tokens)


@pytest.fixture(scope="session")
def faq_items() -> list[dict]:
    data = importlib.resources.files("zaragoza_construction_faq") / "data" / "faq-en.json"
    return json.loads(data.read_text())["questions"]
