"""A request as the engine tracks it: its tokens, how many have KV computed, and its blocks."""

import time
from dataclasses import dataclass, field
from enum import Enum, auto

import torch

from engine.sampling_params import SamplingParams


class Status(Enum):
    WAITING = auto()
    RUNNING = auto()
    FINISHED = auto()


@dataclass(eq=False)
class Sequence:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    prompt: str | None = None
    session_id: str | None = None
    arrival_time: float = field(default_factory=time.monotonic)
    status: Status = Status.WAITING
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0  # tokens whose KV is in the cache
    num_cached_tokens: int = -1  # prompt tokens found in the cache at first scheduling; -1 = not yet
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)  # prefix-cache hashes of its full blocks
    finish_reason: str | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    generator: torch.Generator | None = None  # only for seeded sampling
    token_ids: list[int] = field(init=False)

    def __post_init__(self):
        self.token_ids = list(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is Status.FINISHED

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)
        self.output_token_ids.append(token_id)
