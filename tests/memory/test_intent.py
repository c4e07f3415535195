import json
from pathlib import Path

import pytest

from memory.retrieval.intent import Intent, classify

DATA = Path(__file__).parents[2] / "bench" / "data"


@pytest.mark.parametrize("name", ["intent_queries", "intent_queries_zh", "intent_queries_zh_dev2"])
def test_accuracy_on_the_labelled_sets_is_at_least_85_percent(name):
    rows = [json.loads(line) for line in (DATA / f"{name}.jsonl").read_text(encoding="utf-8").splitlines()]
    assert len(rows) >= 40 and {row["intent"] for row in rows} == {intent.value for intent in Intent}
    correct = [classify(row["query"], row["recent_turns"]).intent == row["intent"] for row in rows]
    assert sum(correct) / len(rows) >= 0.85


def test_each_decision_names_its_rule():
    assert classify("Summarize the manual").rule == "asks for a summary or overview"
    assert classify("Why is that?", ["assistant: The attic comes first."]).intent == Intent.FOLLOW_UP
    # Without recent turns there is nothing to follow up on.
    assert classify("Why is that?").intent == Intent.KNOWLEDGE


def test_chinese_cues_need_the_conversation_they_point_to():
    turns = ["user: 手表保修多久？", "assistant: 手表保修两年。"]
    assert classify("发货之前可以改收货地址吗？").intent == Intent.KNOWLEDGE  # 之前 without anyone saying
    assert classify("你之前说保修多久来着？", turns).intent == Intent.FACT_CHECK
    assert classify("那耳机呢？", turns).intent == Intent.FOLLOW_UP
    assert classify("那耳机呢？").intent == Intent.KNOWLEDGE
    assert classify("多久能到账？", turns).rule == "a Chinese question that is short or points back"
    assert classify("这份手册主要讲了什么？").intent == Intent.SUMMARY
    assert classify("手表从没电到充满大概要多久？").intent == Intent.KNOWLEDGE
