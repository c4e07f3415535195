"""Speculative decoding by prompt lookup (n-gram drafting): no second model.

A decoding sequence's latest n tokens are looked up earlier in its own text (the prompt, which holds the
session's history and any retrieved passages, and the reply so far); the tokens that followed the most
recent longest match are the draft.  A token that occurs once before (a name, a number, an item code)
anchors a draft by itself, below the shortest n-gram: its one continuation is the likely quote.  The
engine checks the last token and the draft in one forward pass (the sampler's accept_drafts), so a step
can emit several tokens for the cost of about one where decoding is bound by reading the weights.

Adaptive per sequence: from the second poor draft in a row, drafting pauses for a number of steps that
doubles with each further one, so a reply with nothing to match decodes as it would without speculation.
One poor draft is forgiven: a quote often parts from its source for a word and then resumes.  Drafts only
take the step's token budget that running and waiting requests leave, best acceptance first, and only the
rows a step holds for about the cost of one, unless the sequence's drafts are usually accepted
(LIKELY_ACCEPTANCE) or it has yet to draft (engine/scheduler.py: likely).
"""

from dataclasses import dataclass

import numpy as np

SPECULATIVE_METHODS = ("ngram",)
MAX_SPECULATIVE_TOKENS = 16  # the most a step checks per sequence
POOR_ACCEPTANCE = 0.3  # a draft whose accepted share is below this counts as poor
# Drafts fill a step up to this many rows.  Up to the rows one pass of the products over the weights
# serves (the model's rows_per_weight_pass: 8 on AVX-512 BF16 vectors, 32 on AMX tiles) a row costs little;
# past them each row costs about a decoded token's arithmetic (2-core AVX-512 BF16 machine, SmolLM2 in
# bf16: a step of 8 sequences 11.6 ms, 32 sequences 36 ms), so a draft token there pays only if it is
# usually accepted (LIKELY_ACCEPTANCE, a sequence's accepted share so far).
MAX_STEP_ROWS = 32
LIKELY_ACCEPTANCE = 0.7
MAX_PAUSE = 16  # steps


@dataclass
class DraftState:
    """One sequence's drafting: its text (prompt, then reply) in an array grown as tokens come, and how
    its drafts fared."""

    text: np.ndarray
    length: int
    prompt_length: int
    drafted: int = 0
    accepted: int = 0
    pause: int = 0  # steps left without drafting
    poor_in_a_row: int = 0

    @classmethod
    def of_prompt(cls, prompt_token_ids: list[int]) -> "DraftState":
        text = np.empty(max(64, 2 * len(prompt_token_ids)), dtype=np.int64)
        text[: len(prompt_token_ids)] = prompt_token_ids
        return cls(text, len(prompt_token_ids), len(prompt_token_ids))

    def sync(self, output_token_ids: list[int]) -> None:
        """Take the reply's tokens generated since the last call."""
        new = output_token_ids[self.length - self.prompt_length :]
        if self.length + len(new) > len(self.text):
            self.text = np.concatenate(
                [self.text[: self.length], np.empty(self.length + 2 * len(new) + 64, np.int64)]
            )
        self.text[self.length : self.length + len(new)] = new
        self.length += len(new)

    @property
    def acceptance(self) -> float:
        """Accepted share of drafted tokens so far, starting from an even chance."""
        return (self.accepted + 1) / (self.drafted + 2)

    def record(self, drafted: int, accepted: int) -> None:
        self.drafted += drafted
        self.accepted += accepted
        if accepted < POOR_ACCEPTANCE * drafted:
            self.poor_in_a_row += 1
            if self.poor_in_a_row > 1:
                self.pause = min(MAX_PAUSE, 2 ** (self.poor_in_a_row - 2))
        else:
            self.poor_in_a_row = 0


class NgramDrafter:
    def __init__(self, num_speculative_tokens: int, prompt_lookup_min: int, prompt_lookup_max: int):
        self.num_speculative_tokens = num_speculative_tokens
        self.sizes = prompt_lookup_min, prompt_lookup_max

    def propose(self, state: DraftState, limit: int) -> list[int]:
        """Up to `limit` tokens that followed the latest longest earlier match of the text's last
        n-gram (prompt_lookup_min <= n <= prompt_lookup_max); [] while paused or without a match."""
        if state.pause > 0:
            state.pause -= 1
            return []
        limit = min(limit, self.num_speculative_tokens)
        return self.lookup(state, limit) if limit > 0 else []

    def lookup(self, state: DraftState, limit: int) -> list[int]:
        start = longest_match_end(state.text[: state.length], *self.sizes)
        return [] if start is None else state.text[start : min(start + limit, state.length)].tolist()


def longest_match_end(text: np.ndarray, shortest: int, longest: int) -> int | None:
    """Where the continuation of the latest longest earlier occurrence of the text's last n tokens
    starts, shortest <= n <= longest, or n = 1 where the last token occurs once before."""
    length = len(text)
    if length < 2:
        return None
    # Candidates: earlier places of the last token (with a token after them), then how far back each
    # keeps matching the suffix.
    ends = np.flatnonzero(text[: length - 1] == text[-1])
    matched = np.ones(len(ends), dtype=np.int64)
    alive = np.ones(len(ends), dtype=bool)
    for back in range(1, longest):
        previous = ends - back
        alive &= previous >= 0
        alive[alive] = text[previous[alive]] == text[length - 1 - back]
        matched += alive
    best = matched.max(initial=0)
    if best < shortest and not (best == 1 and len(ends) == 1):
        return None
    return int(ends[np.flatnonzero(matched == best)[-1]]) + 1
