"""Prompts from stored messages.  Append-only: each turn's prompt starts with the previous turn's prompt and
reply, and a turn's sources travel inside its own user message, so a session's cached KV stays valid."""

from collections.abc import Sequence

from chatsvc.models import Message


def user_turn_text(content: str, context: list[dict] | None) -> str:
    """The question first, then its numbered sources: SmolLM2-135M answered from them more often this way
    than with the sources first or with their titles in between (tried on a few KB questions)."""
    if not context:
        return content
    sources = "\n".join(f"[{source['n']}] {source['text']}" for source in context)
    return f"{content}\n\nSources:\n{sources}\n\nAnswer briefly from the sources and cite them like [1]."


def chat_messages(system_prompt: str | None, path: Sequence[Message]) -> list[dict]:
    """The branch as chat-template messages; replies that produced no text (errors) are left out."""
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    for message in path:
        if message.role == "user":
            messages.append({"role": "user", "content": user_turn_text(message.content, message.context)})
        elif message.content:
            messages.append({"role": message.role, "content": message.content})
    return messages


def fit_prompt(tokenizer, system_prompt: str | None, path: Sequence[Message], max_prompt_tokens: int) -> str:
    """The prompt for `path` (ending with the new user message), dropping the oldest turns only if it
    does not fit the model's context: the one case where a prompt may not extend the previous one."""
    for start in _turn_starts(path):
        messages = chat_messages(system_prompt, path[start:])
        prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        num_tokens = len(tokenizer.encode(prompt, add_special_tokens=False))
        if num_tokens <= max_prompt_tokens:
            return prompt
    raise ValueError(
        f"the message is too long: its prompt is {num_tokens} tokens, and with the reply's max_tokens only "
        f"{max_prompt_tokens} fit the model's context; shorten the message or lower max_tokens"
    )


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


def _turn_starts(path: Sequence[Message]) -> list[int]:
    return [i for i, message in enumerate(path) if message.role == "user"]
