"""Prompts are append-only (with the real model's chat template), sessions get titles and sidebar groups."""

from datetime import UTC, datetime, timedelta

import pytest
from transformers import AutoTokenizer

from chatsvc.context import Source, citations, numbered
from chatsvc.models import Message
from chatsvc.prompts import fit_prompt
from chatsvc.sessions import age_group, make_title

LIMIT = 8192


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir):
    return AutoTokenizer.from_pretrained(smollm2_dir)


def user(content: str, sources: list[Source] | None = None) -> Message:
    return Message(role="user", content=content, context=numbered(sources) if sources else None)


def reply(content: str) -> Message:
    return Message(role="assistant", content=content)


def test_each_prompt_extends_the_previous_prompt_and_reply_sources_included(tokenizer):
    manual = [Source("Manual", "Press the red button to start.", {"document_id": 3})]
    faq = [Source("FAQ", "Refunds take five days.", {}), Source("Terms", "No refunds after a year.", {})]
    turns = [
        (user("How do I start it?", manual), reply("Press the red button [1].")),
        (user("And refunds?", faq), reply("Five days [1].")),
        (user("Thanks!"), None),
    ]
    path, previous = [], None
    for question, answer in turns:
        path.append(question)
        prompt = fit_prompt(tokenizer, "Be brief.", path, LIMIT)
        if previous is not None:
            assert prompt.startswith(previous)
        assert "How do I start it?\n\nSources:\n[1] Press the red button to start.\n\n" in prompt
        if answer is not None:
            path.append(answer)
            previous = prompt + answer.content
    assert prompt.count("[2] No refunds after a year.") == 1
    assert prompt.index("[1] Refunds take five days.") > prompt.index("Press the red button [1].")


def test_a_session_longer_than_the_context_drops_its_oldest_turns_only(tokenizer):
    path = [
        user("first question " * 50),
        reply("first answer"),
        user("second question"),
        reply("ok"),
        user("now?"),
    ]
    whole = fit_prompt(tokenizer, None, path, LIMIT)
    short_limit = len(tokenizer.encode(whole, add_special_tokens=False)) - 10
    trimmed = fit_prompt(tokenizer, None, path, short_limit)
    assert (
        "first question" not in trimmed
        and "second question" in trimmed
        and trimmed.endswith("now?<|im_end|>\n<|im_start|>assistant\n")
    )
    with pytest.raises(ValueError, match="too long"):
        fit_prompt(tokenizer, None, [user("word " * 300)], 100)


def test_citations_mark_the_sources_the_reply_cites():
    context = numbered([Source("A", "a", {"id": 1}), Source("B", "b", {"id": 2})])
    assert [(c["n"], c["cited"]) for c in citations(context, "As [2] says.")] == [(1, False), (2, True)]


def test_titles_come_from_the_first_message_cut_at_a_word():
    assert make_title("  What is\nthe capital of France? ") == "What is the capital of France?"
    long = make_title(
        "Please summarise the following extremely long report about quarterly earnings in detail"
    )
    assert long.endswith("…") and len(long) <= 61 and not long[:-1].endswith(" ")


def test_sidebar_groups_by_age():
    now = datetime(2026, 6, 15, 12, tzinfo=UTC)
    ages = [timedelta(hours=1), timedelta(days=1), timedelta(days=3), timedelta(days=20), timedelta(days=90)]
    groups = [age_group(now - age, now) for age in ages]
    assert groups == ["Today", "Yesterday", "Previous 7 days", "Previous 30 days", "Older"]
