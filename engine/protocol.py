"""The interface the chat service uses; the native engine and the vLLM backend both implement it."""

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol

from engine.outputs import StreamDelta
from engine.sampling_params import SamplingParams


@dataclass
class EngineStats:
    num_running: int = 0
    num_waiting: int = 0
    kv_blocks_total: int = 0
    kv_blocks_used: int = 0
    prefix_cache_queries: int = 0  # prompt tokens looked up in the prefix cache
    prefix_cache_hits: int = 0  # of those, tokens found
    prompt_tokens_total: int = 0
    prefill_tokens_total: int = 0  # prompt tokens actually computed (not served from a cache)
    session_reused_tokens: int = 0  # prompt tokens served from sessions' KV
    generation_tokens_total: int = 0
    num_preemptions: int = 0
    spec_num_drafts: int = 0  # speculative decoding: drafts checked
    spec_draft_tokens: int = 0  # tokens in them
    spec_accepted_tokens: int = 0  # of those, accepted
    ttft_seconds: list[float] = field(default_factory=list)  # recent requests, oldest first
    itl_seconds: list[float] = field(default_factory=list)  # recent inter-token gaps
    dtype: str = ""  # the compute dtype
    quantization: str = "none"  # of the weights
    kv_cache_dtype: str = ""
    weight_bytes: int = 0
    kv_pool_bytes: int = 0
    kv_pool_tokens: int = 0  # tokens the KV block pool holds
    speculative: str = "none"  # the drafting method, or none

    @property
    def kv_usage(self) -> float:
        return self.kv_blocks_used / self.kv_blocks_total if self.kv_blocks_total else 0.0


class EngineClient(Protocol):
    model_name: str
    max_model_len: int

    @property
    def tokenizer(self): ...

    def generate(
        self,
        prompt: str | list[int],
        params: SamplingParams,
        request_id: str,
        session_id: str | None = None,
    ) -> AsyncIterator[StreamDelta]:
        """Stream the reply; raises ValueError (before the first delta) for a request it cannot serve."""

    async def abort(self, request_id: str) -> None: ...

    def stats(self) -> EngineStats: ...

    def is_healthy(self) -> bool: ...

    def shutdown(self) -> None: ...
