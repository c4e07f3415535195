"""Which messages of a branch the model still sees when it answers the next one: those its prompt keeps (the
oldest turns go when a long chat outgrows the context) whose KV the session still holds (session memory
evicts tokens when a session outgrows its budget).  Only the others are worth retrieving (sources.py): a
turn the model sees already would be prefilled a second time for nothing."""

import asyncio
from collections.abc import Sequence

import numpy as np

from chatsvc import prompts
from chatsvc.engines import session_memory
from chatsvc.models import ChatSession, Message
from engine.protocol import EngineClient

# A turn with less than this share of its tokens left in the session's KV counts as evicted: eviction keeps
# a turn's heavy hitters, which hold its gist more often than its details (a code, a number).
KEPT_SHARE = 0.5


async def messages_in_view(
    engine: EngineClient, session: ChatSession, path: Sequence[Message], max_prompt_tokens: int
) -> set[int]:
    """Ids of the messages before the last of `path` (the new question) that the model sees."""
    tokenizer, system_prompt = engine.tokenizer, session.system_prompt
    start = await asyncio.to_thread(prompts.kept_start, tokenizer, system_prompt, path, max_prompt_tokens)
    kept = list(path[start:-1])
    memory = session_memory(engine)
    if memory is None or not kept:
        return {message.id for message in kept}
    await memory.resume(session.id)  # from disk, as the turn's generate would
    info = await memory.session_info(session.id)
    if not info.evicted_tokens:
        return {message.id for message in kept}
    spans = await asyncio.to_thread(prompts.message_token_spans, tokenizer, system_prompt, kept)
    held = np.zeros(max(info.text_tokens, *(span.stop for span in spans)), dtype=bool)
    held[info.positions] = True
    return {message.id for message, span in zip(kept, spans, strict=True) if _held(held, span)}


def _held(held: np.ndarray, span: range) -> bool:
    return not span or held[span.start : span.stop].mean() >= KEPT_SHARE
