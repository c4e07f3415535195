"""How much attention each cached token receives: the signal attention-based eviction keeps tokens by.

Two sources, both summed over layers and heads into one score per KV slot:
- decoding (H2O's accumulation): every generated token's attention probabilities over its context,
  which the decode path computes anyway;
- prefill (SnapKV's observation window): the last WINDOW queries of each prefill chunk, whose
  probabilities our CPU prefill kernel sums as it goes; on the torch path they are recomputed for those
  few rows, since fused SDPA does not return them.
Summed, not averaged per query that could see a slot: the mean favours recent tokens (queries look
mostly nearby), so it dropped an early fact before the filler after it.  Attention-based eviction
recalled the fact in 11 of 48 conversations with the sum (18 with the pooling in
memory/session_memory/eviction.py), sinks + recent only in 4; with the mean, in 3 of 96 against 5
(python -m bench.eviction_quality).
The recent window keeps what the sum has not seen yet.
A speculative step's draft rows (decode rows too) count only once the draft is checked, and only the rows
of the sequence's last token and its accepted drafts (commit_draft): what decoding them one by one adds.
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
        self.drafts: dict[int, tuple[int, torch.Tensor | None]] = {}  # first row -> (rows, held attention)

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

    def hold_draft(self, first_row: int, rows: int) -> None:
        """Decode rows [first_row, first_row + rows) are a sequence's last token and its draft."""
        self.drafts[first_row] = (rows, None)

    def add_decode(self, received: torch.Tensor) -> None:
        """received: (decodes, max_context) attention probabilities summed over heads (and maybe layers),
        exactly 0 past each context."""
        received = received.float()
        if self.drafts:
            received = received.clone()
            for first, (rows, held) in self.drafts.items():
                part = received[first : first + rows]
                self.drafts[first] = (rows, part.clone() if held is None else held + part)
                part.zero_()
        self.store.index_add_(0, self.decode_slots.flatten(), received.flatten())

    def commit_draft(self, first_row: int, accepted_rows: int) -> None:
        """Count the first `accepted_rows` rows of a draft: its last token's and its accepted drafts'."""
        _, held = self.drafts.pop(first_row)
        rows = slice(first_row, first_row + accepted_rows)
        self.store.index_add_(0, self.decode_slots[rows].flatten(), held[:accepted_rows].flatten())

    def add_prefill(self, index: int, received: torch.Tensor) -> None:
        """received: (context,) attention the prefill chunk's last WINDOW queries gave each position."""
        self.store.index_add_(0, self.prefill_slots[index], received)


def window_attention_received(q: torch.Tensor, keys: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The attention probabilities of the last WINDOW queries, summed over them and their heads.
    q: (chunk, heads, head_dim); keys: (kv_heads, context, head_dim); mask: (chunk, context)."""
    rows = min(WINDOW, q.shape[0])
    window = q[-rows:].transpose(0, 1).float()  # (heads, rows, head_dim)
    group = q.shape[1] // keys.shape[0]
    scores = window @ keys.float().repeat_interleave(group, dim=0).transpose(1, 2) * q.shape[-1] ** -0.5
    return scores.masked_fill(~mask[-rows:], float("-inf")).softmax(dim=-1).sum(dim=(0, 1))
