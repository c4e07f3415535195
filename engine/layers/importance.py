"""How much attention each cached token receives: the signal attention-based eviction keeps tokens by.

Two sources, both summed over layers and heads into one score per KV slot:
- decoding (H2O's accumulation): every generated token's attention probabilities over its context,
  which the decode path computes anyway;
- prefill (SnapKV's observation window): the last WINDOW queries of each prefill chunk, whose
  probabilities our CPU prefill kernel sums as it goes; on the torch path they are recomputed for those
  few rows, since fused SDPA does not return them.
A speculative step's chunk (a sequence's last token and its draft) counts like decoding: only the
queries of positions whose drafts were accepted, known after the step (commit_draft).
Summed, not averaged per query that could see a slot: the mean favours recent tokens (queries look
mostly nearby), so it dropped an early fact before the filler after it.  Attention-based eviction
recalled the fact in 11 of 48 conversations with the sum (18 with the pooling in
memory/session_memory/eviction.py), sinks + recent only in 4; with the mean, in 3 of 96 against 5
(python -m bench.eviction_quality).
The recent window keeps what the sum has not seen yet.
"""

import torch

WINDOW = 32


class ImportanceTracker:
    """One step's view of the importance store: (slots,) attention received, summed."""

    def __init__(self, store: torch.Tensor, block_size: int):
        self.store = store
        self.block_size = block_size
        self.decode_slots: torch.Tensor | None = None  # (decodes, max_context)
        self.prefill_slots: list[torch.Tensor] = []  # per prefill chunk, (context,)
        self.drafted: dict[int, torch.Tensor] = {}  # per chunk with a draft: (its queries, context), summed

    def slots_of(self, block_ids: torch.Tensor, context: int) -> torch.Tensor:
        """(..., context) slot of each context position of the given block tables."""
        offsets = torch.arange(self.block_size, device=block_ids.device)
        return (block_ids[..., :, None] * self.block_size + offsets).flatten(-2)[..., :context]

    def start_step(self, new_slots: torch.Tensor, meta) -> None:
        """Clear the slots about to get new KV, and map this step's attention columns to slots."""
        self.store[new_slots] = 0
        if meta.num_decode_tokens:
            tables = meta.decode_block_tables
            self.decode_slots = self.slots_of(tables, tables.shape[1] * self.block_size)
        self.prefill_slots = [self.slots_of(c.block_ids, c.context) for c in meta.prefills]
        self.drafted = {index: 0 for index, chunk in enumerate(meta.prefills) if chunk.drafted}

    def add_decode(self, received: torch.Tensor) -> None:
        """received: (decodes, max_context) attention probabilities summed over heads (and maybe layers),
        exactly 0 past each context."""
        self.store.index_add_(0, self.decode_slots.flatten(), received.flatten().float())

    def add_prefill(self, index: int, received: torch.Tensor) -> None:
        """received: (queries, context) attention each of the chunk's last WINDOW queries gave each
        position."""
        if index in self.drafted:
            self.drafted[index] = self.drafted[index] + received
        else:
            self.store.index_add_(0, self.prefill_slots[index], received.sum(0))

    def commit_draft(self, index: int, accepted_queries: int) -> None:
        """Count the first `accepted_queries` queries of a drafted chunk: its last token's and those of
        its accepted drafts."""
        self.store.index_add_(0, self.prefill_slots[index], self.drafted.pop(index)[:accepted_queries].sum(0))


def window_attention_received(q: torch.Tensor, keys: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The attention probabilities of each of the last WINDOW queries, summed over its heads: (queries,
    context).
    q: (chunk, heads, head_dim); keys: (kv_heads, context, head_dim); mask: (chunk, context)."""
    rows = min(WINDOW, q.shape[0])
    window = q[-rows:].transpose(0, 1).float()  # (heads, rows, head_dim)
    group = q.shape[1] // keys.shape[0]
    scores = window @ keys.float().repeat_interleave(group, dim=0).transpose(1, 2) * q.shape[-1] ** -0.5
    return scores.masked_fill(~mask[-rows:], float("-inf")).softmax(dim=-1).sum(dim=0)
