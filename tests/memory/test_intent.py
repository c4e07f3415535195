import json
from pathlib import Path

from memory.retrieval.intent import Intent, classify

LABELLED = Path(__file__).parents[2] / "bench" / "data" / "intent_queries.jsonl"


def test_accuracy_on_the_labelled_set_is_at_least_85_percent():
    rows = [json.loads(line) for line in LABELLED.read_text().splitlines()]
    assert len(rows) >= 40 and {row["intent"] for row in rows} == {intent.value for intent in Intent}
    correct = [classify(row["query"], row["recent_turns"]).intent == row["intent"] for row in rows]
    assert sum(correct) / len(rows) >= 0.85


def test_each_decision_names_its_rule():
    assert classify("Summarize the manual").rule == "asks for a summary or overview"
    assert classify("Why is that?", ["assistant: The attic comes first."]).intent == Intent.FOLLOW_UP
    # Without recent turns there is nothing to follow up on.
    assert classify("Why is that?").intent == Intent.KNOWLEDGE
