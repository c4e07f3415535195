"""Prompts are append-only (with the real model's chat template), sessions get titles and sidebar groups."""

import time
from datetime import UTC, datetime, timedelta

import pytest
from transformers import AutoTokenizer

from chatsvc.chat_sessions import age_group
from chatsvc.citations import Source, citations, cited_numbers, numbered
from chatsvc.models import Message
from chatsvc.prompts import chat_messages, fit_prompt, kept_start, message_token_spans, user_turn_text
from chatsvc.turn_flow import make_title

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
    assert (kept_start(tokenizer, None, path, LIMIT), kept_start(tokenizer, None, path, short_limit)) == (
        0,
        2,
    )


def test_message_token_spans_cover_each_text_in_the_rendered_conversation(tokenizer):
    path = [user("My locker code is 4711."), reply("Noted."), user("商品签收后七天内可以退货"), reply("")]
    text = tokenizer.apply_chat_template(chat_messages("Be brief.", path), tokenize=False)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    spans = message_token_spans(tokenizer, "Be brief.", path)
    decoded = [tokenizer.decode(ids[span.start : span.stop]) for span in spans]
    assert decoded == ["My locker code is 4711.", "Noted.", "商品签收后七天内可以退货", ""]


def fit_one_turn_at_a_time(
    tokenizer, system_prompt: str | None, path: list[Message], limit: int
) -> str | None:
    """The former fit_prompt, one render per dropped turn: the prompt fit_prompt must still give."""
    for start in [i for i, message in enumerate(path) if message.role == "user"]:
        messages = chat_messages(system_prompt, path[start:])
        prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        if len(tokenizer.encode(prompt, add_special_tokens=False)) <= limit:
            return prompt
    return None


HISTORIES = {
    "a short chat": [user("Hi"), reply("Hello! How can I help?"), user("What is the capital of France?")],
    "sources": [
        user("How do I start it?", [Source("Manual", "Press the red button to start.", {})]),
        reply("Press the red button [1]."),
        user(
            "And refunds?",
            [Source("FAQ", "Refunds take five days.", {}), Source("T", "None after a year.", {})],
        ),
        reply("Five days [1]."),
        user("Thanks!"),
    ],
    # Text opening with white space takes fewer tokens in the prompt than counted alone.
    "white space, an error reply, a reply first": [
        reply("Welcome back."),
        user("\n\n  indented\tquestion " * 8),
        reply(""),
        user(" again, with a leading space " * 5),
        reply("\t\tanswer 😀 " * 6),
        user("\r\nlast one?"),
        reply("done " * 20),
        user("now?"),
    ],
}


@pytest.mark.parametrize("system_prompt", [None, "Be brief."])
@pytest.mark.parametrize("history", HISTORIES)
def test_the_prompt_is_the_one_dropping_one_turn_at_a_time_gives(tokenizer, history, system_prompt):
    path = HISTORIES[history]
    whole = fit_one_turn_at_a_time(tokenizer, system_prompt, path, LIMIT)
    assert fit_prompt(tokenizer, system_prompt, path, LIMIT) == whole
    for limit in range(10, len(tokenizer.encode(whole, add_special_tokens=False)) + 1, 3):
        expected = fit_one_turn_at_a_time(tokenizer, system_prompt, path, limit)
        if expected is None:
            with pytest.raises(ValueError, match="too long"):
                fit_prompt(tokenizer, system_prompt, path, limit)
        else:
            assert fit_prompt(tokenizer, system_prompt, path, limit) == expected, limit


def long_history(pairs: int, words: int) -> list[Message]:
    path = []
    for n in range(pairs):
        path += [user(f"question {n} " + "word " * words), reply(f"answer {n} " + "reply " * words)]
    return [*path, user("now?")]


@pytest.mark.parametrize(
    ("path", "cpu_seconds"),
    [
        (long_history(600, 35), 1),  # 220 kB: 22 s of CPU when each dropped turn cost a render
        (long_history(499, 180), 2),  # 999 messages, 1 MB
        ([user("0123456789" * 100_000), reply("ok"), user("now?")], 2),
    ],
    ids=["600 pairs", "1 MB in 999 messages", "1 MB in one old message"],
)
def test_a_long_history_costs_about_one_context_of_work(tokenizer, path, cpu_seconds):
    started = time.process_time()
    prompt = fit_prompt(tokenizer, None, path, LIMIT)
    assert time.process_time() - started < cpu_seconds
    # The old way from a few turns back reaches the same start, if it is the earliest that fits.
    kept_turns = prompt.count("<|im_start|>user")
    assert 0 < kept_turns < sum(message.role == "user" for message in path)
    assert prompt == fit_one_turn_at_a_time(tokenizer, None, path[-2 * kept_turns - 5 :], LIMIT)


def test_a_new_message_too_long_alone_is_refused_with_its_size_quickly(tokenizer):
    started = time.process_time()
    with pytest.raises(ValueError, match=r"too long: its prompt is 2000\d\d tokens"):
        fit_prompt(tokenizer, None, [user("word " * 200_000)], LIMIT)
    assert time.process_time() - started < 2


def test_citations_mark_the_sources_the_reply_cites():
    context = numbered([Source("A", "a", {"id": 1}), Source("B", "b", {"id": 2})])
    assert [(c["n"], c["cited"]) for c in citations(context, "As [2] says.")] == [(1, False), (2, True)]


def test_a_chinese_question_gets_its_sources_and_instruction_in_chinese():
    context = numbered([Source("退货政策", "未使用的商品可在30天内退货。", {"id": 1})])
    chinese = user_turn_text("iPhone 15 的电池怎么换？", context)
    assert "来源：\n【1】未使用的商品可在30天内退货。" in chinese and chinese.endswith("注明出处。")
    english = user_turn_text("What does 退货 mean?", context)
    assert "Sources:\n[1] 未使用的商品" in english and english.endswith("cite them like [1].")
    assert user_turn_text("退货要多久？", None) == "退货要多久？"


@pytest.mark.parametrize(
    "reply, cited",
    [
        ("As [2] says, and [10] too.", {2, 10}),
        ("See [1, 3] and [4][5].", {1, 3, 4, 5}),
        ("退货期限为30天【1】。", {1}),
        ("根据【1，2】和【3、4】，可以退款。", {1, 2, 3, 4}),
        ("见［２］。", {2}),
        ("No markers, 2024 or (1) or [a].", set()),
    ],
)
def test_citation_markers_in_english_and_chinese_styles_are_found(reply, cited):
    assert cited_numbers(reply) == cited


def test_titles_come_from_the_first_message_cut_at_a_word():
    assert make_title("  What is\nthe capital of France? ") == "What is the capital of France?"
    long = make_title(
        "Please summarise the following extremely long report about quarterly earnings in detail"
    )
    assert long.endswith("…") and len(long) <= 61 and not long[:-1].endswith(" ")


def test_chinese_titles_take_half_the_characters_and_end_at_a_clause():
    question = (
        "我在上个月买了一台北欧不锈钢电热水壶，但是到现在还没有收到货，请问订单号58213的物流情况怎么样？"
    )
    assert make_title(question) == "我在上个月买了一台北欧不锈钢电热水壶…"
    assert make_title("退货要多久？") == "退货要多久？"
    unbroken = make_title("退" * 50)
    assert unbroken == "退" * 30 + "…"


def test_sidebar_groups_by_age():
    now = datetime(2026, 6, 15, 12, tzinfo=UTC)
    ages = [timedelta(hours=1), timedelta(days=1), timedelta(days=3), timedelta(days=20), timedelta(days=90)]
    groups = [age_group(now - age, now) for age in ages]
    assert groups == ["Today", "Yesterday", "Previous 7 days", "Previous 30 days", "Older"]
