"""A request as the engine tracks it: its tokens, how many have KV computed, and its blocks."""

import time
from dataclasses import dataclass, field
from enum import Enum, auto

import torch

from engine.sampling_params import SamplingParams
from engine.speculative import DraftState


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
    token_ids: list[int] = field(init=False)  # what each KV slot holds (or will hold), in slot order
    positions: list[int] = field(init=False)  # each slot's position in the text (RoPE), increasing
    session_reused: int = 0  # leading slots whose KV came from the session
    text_start: int = 0  # where in the prompt the slots after those continue
    draft: DraftState | None = None  # with speculative decoding: its text for lookup, its acceptance

    def __post_init__(self):
        self.reset_to_prompt()

    def reset_to_prompt(self) -> None:
        self.token_ids = list(self.prompt_token_ids)
        self.positions = list(range(len(self.token_ids)))
        self.session_reused = self.text_start = self.num_computed_tokens = 0

    def continue_session(self, token_ids: list[int], positions: list[int], prompt_start: int) -> None:
        """Start on a session's KV: its slots first, then the prompt from `prompt_start` on."""
        tail = self.prompt_token_ids[prompt_start:]
        self.token_ids = token_ids + tail
        self.positions = positions + list(range(prompt_start, prompt_start + len(tail)))
        self.session_reused = len(token_ids)
        self.text_start = prompt_start

    def session_text(self) -> list[int]:
        """The conversation's tokens whose KV this sequence has computed."""
        return (
            self.prompt_token_ids[: self.text_start]
            + self.token_ids[self.session_reused : self.num_computed_tokens]
        )

    @property
    def contiguous(self) -> bool:
        """True when slot i holds token i of the text, so its blocks may enter the prefix cache."""
        return self.positions[-1] == len(self.positions) - 1

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
        self.positions.append(self.positions[-1] + 1)
        self.output_token_ids.append(token_id)


@dataclass
class ScheduledSeq:
    """A sequence in one step, with how many of its tokens the step computes."""

    seq: Sequence
    num_new_tokens: int  # of the sequence's own tokens
    draft_token_ids: list[int] = field(default_factory=list)  # checked after them in the same pass

    @property
    def num_input_tokens(self) -> int:
        return self.num_new_tokens + len(self.draft_token_ids)
