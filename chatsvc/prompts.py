"""Prompts from stored messages.  Append-only: each turn's prompt starts with the previous turn's prompt and
reply, and a turn's sources travel inside its own user message, so a session's cached KV stays valid."""

import bisect
import functools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from chatsvc.models import Message

# Text that starts with white space shares a token with the template's newline before it, so a message can
# take up to 2 tokens fewer in the prompt than counted alone (SmolLM2's tokenizer, on varied texts).
_MERGE_SLACK_TOKENS = 2
# English is about 4 characters a token: a message's first 16 characters per token of the context usually
# show that it does not fit, without tokenising the rest of a long one.
_PREFIX_CHARS_PER_TOKEN = 16
_HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
_LATIN = re.compile(r"[A-Za-z]")


def user_turn_text(content: str, context: list[dict] | None) -> str:
    """The question first, then its numbered sources: SmolLM2-135M answered from them more often this way
    than with the sources first or with their titles in between (tried on a few KB questions).  A Chinese
    question gets the instruction, the sources' heading and the markers in Chinese.  Decided by the
    question alone, so the stored turn renders the same text every time (prompts stay append-only)."""
    if not context:
        return content
    if is_chinese(content):
        sources = "\n".join(f"【{source['n']}】{source['text']}" for source in context)
        return f"{content}\n\n来源：\n{sources}\n\n请根据来源简要回答，并用【1】这样的编号注明出处。"
    sources = "\n".join(f"[{source['n']}] {source['text']}" for source in context)
    return f"{content}\n\nSources:\n{sources}\n\nAnswer briefly from the sources and cite them like [1]."


def is_chinese(text: str) -> bool:
    """At least a third of the text's letters are Han characters (a Han character is about a word, so
    "iPhone 15 的电池怎么换？" is Chinese and "What does 退货 mean?" is not)."""
    han = len(_HAN.findall(text))
    latin = len(_LATIN.findall(text))
    return han > 0 and 3 * han >= han + latin


def chat_messages(system_prompt: str | None, path: Sequence[Message]) -> list[dict]:
    """The branch as chat-template messages; replies that produced no text (errors) are left out."""
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    return messages + [chat for message in path if (chat := _chat_message(message)) is not None]


def fit_prompt(tokenizer, system_prompt: str | None, path: Sequence[Message], max_prompt_tokens: int) -> str:
    """The prompt for `path` (ending with the new user message), dropping the oldest turns only if it
    does not fit the model's context: the one case where a prompt may not extend the previous one.

    The kept turns start at the earliest turn whose prompt fits.  Only the newest messages that might fit
    are tokenised, once each, to estimate it; then a few renders of at most about the context's length
    find it exactly, so a long history costs about as much as a full context, not one render per turn."""
    start, rendered = _fit(tokenizer, system_prompt, path, max_prompt_tokens)
    if start is not None:
        return rendered(start)[0]
    num_tokens = rendered(_turn_starts(path)[-1])[1]
    raise ValueError(
        f"the message is too long: its prompt is {num_tokens} tokens, and with the reply's max_tokens only "
        f"{max_prompt_tokens} fit the model's context; shorten the message or lower max_tokens"
    )


def kept_start(tokenizer, system_prompt: str | None, path: Sequence[Message], max_prompt_tokens: int) -> int:
    """Where in `path` the prompt fit_prompt makes of it starts (len(path) when none fits)."""
    start, _ = _fit(tokenizer, system_prompt, path, max_prompt_tokens)
    return len(path) if start is None else start


def message_token_spans(tokenizer, system_prompt: str | None, path: Sequence[Message]) -> list[range]:
    """The tokens of each message's text in the conversation `path` renders to, which is what a session's
    KV positions count; an empty range for a message the prompt leaves out (a reply that failed)."""
    text = tokenizer.apply_chat_template(chat_messages(system_prompt, path), tokenize=False)
    offsets = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    token_starts, token_ends = [start for start, _ in offsets], [end for _, end in offsets]
    spans, cursor = [], 0
    for message in path:
        if (chat := _chat_message(message)) is None:
            spans.append(range(0))
            continue
        begin = text.index(chat["content"], cursor)
        cursor = begin + len(chat["content"])
        first = bisect.bisect_right(token_ends, begin)  # the first token that holds some of the text
        spans.append(range(first, bisect.bisect_left(token_starts, cursor)))
    return spans


def _fit(tokenizer, system_prompt: str | None, path: Sequence[Message], max_prompt_tokens: int):
    """The start of the kept turns (None when not even the last fits) and the cached render of a start."""
    turns = _turns_that_might_fit(tokenizer, system_prompt, path, max_prompt_tokens)
    rendered = functools.cache(lambda start: _render(tokenizer, system_prompt, path[start:]))
    start = _earliest_fitting(turns, max_prompt_tokens, lambda start: rendered(start)[1] <= max_prompt_tokens)
    return start, rendered


def system_prefix_tokens(tokenizer, system_prompt: str | None) -> int:
    """Tokens before the first user message's text: the system prompt (or the one the chat template puts in
    its place) and the role header.  The session memory never evicts them."""
    system = chat_messages(system_prompt, [])

    def render(text: str) -> str:
        messages = [*system, {"role": "user", "content": text}]
        return tokenizer.apply_chat_template(messages, add_generation_prompt=False, tokenize=False)

    first, second = render("a"), render("b")
    prefix = first[: next(i for i, (x, y) in enumerate(zip(first, second, strict=False)) if x != y)]
    return len(tokenizer.encode(prefix, add_special_tokens=False))


def _chat_message(message: Message) -> dict | None:
    if message.role == "user":
        return {"role": "user", "content": user_turn_text(message.content, message.context)}
    return {"role": message.role, "content": message.content} if message.content else None


def _turn_starts(path: Sequence[Message]) -> list[int]:
    return [i for i, message in enumerate(path) if message.role == "user"]


@dataclass(frozen=True)
class _TemplateTokens:
    """Tokens the chat template adds once per prompt (the system part, the reply's header) and around each
    message's text, by role."""

    per_prompt: int
    per_message: dict[str, int]

    @classmethod
    def measure(cls, tokenizer, system_prompt: str | None) -> "_TemplateTokens":
        system = chat_messages(system_prompt, [])
        # Alternating roles, the one order every chat template accepts.
        turn = [{"role": role, "content": "a"} for role in ("user", "assistant", "user")]
        first, second, third = (_render_messages_tokens(tokenizer, [*system, *turn[:n]]) for n in (1, 2, 3))
        text = _num_tokens(tokenizer, "a")
        user, assistant = third - second - text, second - first - text
        return cls(first - user - text, {"user": user, "assistant": assistant})


def _turns_that_might_fit(
    tokenizer, system_prompt: str | None, path: Sequence[Message], max_prompt_tokens: int
) -> list[tuple[int, int]]:
    """(start, estimated prompt tokens) of the newest turns that might fit, oldest first: the estimate counts
    each message alone, so a turn whose estimate is over by up to _MERGE_SLACK_TOKENS a message may fit."""
    template = _TemplateTokens.measure(tokenizer, system_prompt)
    estimate, slack, turns = template.per_prompt, 0, []
    for start in reversed(range(len(path))):
        if (message := _chat_message(path[start])) is not None:
            text_tokens = _num_tokens_up_to(tokenizer, message["content"], max_prompt_tokens)
            estimate += template.per_message[message["role"]] + text_tokens
            slack += _MERGE_SLACK_TOKENS
        if estimate - slack > max_prompt_tokens:
            break
        if path[start].role == "user":
            turns.append((start, estimate))
    return turns[::-1]


def _earliest_fitting(
    turns: list[tuple[int, int]], max_prompt_tokens: int, fits: Callable[[int], bool]
) -> int | None:
    """The earliest turn start that fits, by bisection (a later start never makes a longer prompt), trying
    first the earliest turn estimated to fit, which usually is the answer."""
    estimated = (i for i, (_, estimate) in enumerate(turns) if estimate <= max_prompt_tokens)
    low, high = 0, len(turns)
    probe = next(estimated, len(turns) - 1)
    while low < high:
        if fits(turns[probe][0]):
            high = probe
        else:
            low = probe + 1
        probe = (low + high) // 2
    return turns[high][0] if high < len(turns) else None


def _render(tokenizer, system_prompt: str | None, path: Sequence[Message]) -> tuple[str, int]:
    prompt = _render_messages(tokenizer, chat_messages(system_prompt, path))
    return prompt, _num_tokens(tokenizer, prompt)


def _render_messages(tokenizer, messages: list[dict]) -> str:
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


def _render_messages_tokens(tokenizer, messages: list[dict]) -> int:
    return _num_tokens(tokenizer, _render_messages(tokenizer, messages))


def _num_tokens_up_to(tokenizer, text: str, enough: int) -> int:
    """The tokens in `text`, or in a prefix of it once that has over `enough`."""
    prefix = text[: _PREFIX_CHARS_PER_TOKEN * enough]
    num_tokens = _num_tokens(tokenizer, prefix)
    if num_tokens > enough or len(prefix) == len(text):
        return num_tokens
    return _num_tokens(tokenizer, text)


def _num_tokens(tokenizer, text: str) -> int:
    return len(tokenizer.encode(text, add_special_tokens=False))
