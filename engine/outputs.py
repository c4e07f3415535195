"""What the engine hands back: whole results (offline `LLM`) and incremental deltas (streaming)."""

from dataclasses import dataclass


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None  # "stop", "length", "abort" or None while running


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    num_cached_tokens: int  # prompt tokens whose KV was reused (prefix cache or session KV)


@dataclass
class StreamDelta:
    """One step's news for one streaming request."""

    request_id: str
    text: str  # text new since the previous delta (never a broken UTF-8 character)
    token_ids: list[int]  # token ids new since the previous delta
    finish_reason: str | None
    num_prompt_tokens: int
    num_cached_tokens: int
    num_draft_tokens: int = 0  # speculative decoding, so far in this request: tokens drafted
    num_accepted_tokens: int = 0  # and of those, accepted
