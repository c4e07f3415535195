"""A turn: one reply being generated, with what the caller chose for it and what it produced."""

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from chatsvc.models import MessageStatus
from engine.outputs import StreamDelta


@dataclass
class TurnOptions:
    max_tokens: int | None = None  # None: the server's default
    temperature: float | None = None  # None: the session's, else 1.0
    top_p: float = 1.0
    stop: list[str] = field(default_factory=list)
    seed: int | None = None


@dataclass
class Usage:
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens whose KV was reused (session KV or prefix cache)
    completion_tokens: int = 0


@dataclass
class TurnResult:
    status: MessageStatus
    finish_reason: str | None  # stop, length, abort, or None after an error
    text: str
    usage: Usage
    citations: list[dict]
    error: Exception | None = None  # ValueError: the request's fault; EngineFailed: the server's


class Turn:
    """A reply being generated: its stored ids, its text as it streams, then its result."""

    def __init__(
        self,
        session_id: str,
        user_message_id: int,
        reply_id: int,
        model_name: str,
        started: float,
        question: str | None,
    ):
        self.session_id = session_id
        self.user_message_id = user_message_id
        self.reply_id = reply_id
        self.question = question  # the new user message's text; None when regenerating
        self.model_name = model_name
        self.started = started  # perf_counter when the turn arrived
        self.created = int(time.time())
        self.pieces: asyncio.Queue[str | None] = asyncio.Queue()  # None ends the stream
        self.task: asyncio.Task[TurnResult] | None = None
        self.generating = True  # until the engine is done; storing the result follows

    async def stream(self) -> AsyncIterator[str]:
        while (piece := await self.pieces.get()) is not None:
            yield piece

    async def result(self) -> TurnResult:
        return await asyncio.shield(self.task)

    def cancel(self) -> None:
        """Stop generating; the reply is stored as aborted with its partial text.  No-op once generated."""
        if self.generating:
            self.task.cancel()


@dataclass
class Progress:
    started: float
    parts: list[str] = field(default_factory=list)
    saved_length: int = 0
    usage: Usage = field(default_factory=Usage)
    finish_reason: str | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    draft_tokens: int = 0
    accepted_tokens: int = 0

    def text(self) -> str:
        return "".join(self.parts)

    def add(self, delta: StreamDelta, now: float) -> float | None:
        """Record a delta; returns the gap since the previous piece of text, if any."""
        self.usage.prompt_tokens = delta.num_prompt_tokens
        self.usage.cached_tokens = delta.num_cached_tokens
        self.usage.completion_tokens += len(delta.token_ids)
        self.draft_tokens, self.accepted_tokens = delta.num_draft_tokens, delta.num_accepted_tokens
        self.finish_reason = delta.finish_reason or self.finish_reason
        if not delta.text:
            return None
        self.parts.append(delta.text)
        gap = now - self.last_token_at if self.last_token_at is not None else None
        self.first_token_at = self.first_token_at or now
        self.last_token_at = now
        return gap

    def stored_fields(self) -> dict:
        ttft = self.first_token_at - self.started if self.first_token_at else None
        decode_time = (self.last_token_at or 0) - (self.first_token_at or 0)
        return dict(
            content=self.text(),
            finish_reason=self.finish_reason,
            prompt_tokens=self.usage.prompt_tokens,
            cached_tokens=self.usage.cached_tokens,
            completion_tokens=self.usage.completion_tokens,
            ttft_seconds=ttft,
            tokens_per_second=self.usage.completion_tokens / decode_time if decode_time > 0 else None,
            draft_tokens=self.draft_tokens or None,
            accepted_tokens=self.accepted_tokens if self.draft_tokens else None,
        )
