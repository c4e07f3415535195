"""Turns a scheduled step into one flat batch, runs the model over the paged KV cache, samples."""

import itertools

import torch

from engine.block_manager import blocks_for
from engine.kernels import cpu_kernels
from engine.kv_cache import KvCache
from engine.layers.attention import AttentionMetadata, PrefillChunk
from engine.layers.importance import ImportanceTracker
from engine.models.decoder import CausalLM, ModelShape
from engine.sampler import accept_drafts, sample
from engine.sequence import ScheduledSeq, Sequence


class ModelRunner:
    def __init__(self, model: CausalLM, kv_cache: KvCache, seed: int = 0):
        self.model = model
        self.kv_cache = kv_cache
        self.block_size = kv_cache.block_size
        self.device = kv_cache.tensor.device
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        if self.device.type == "cpu":
            model.use_kernels(cpu_kernels(), attention=attention_kernels_fit(model.shape, self.block_size))

    @torch.inference_mode()
    def run(self, batch: list[ScheduledSeq]) -> dict[Sequence, list[int]]:
        """Compute the KV of every scheduled token (drafts included); for each sequence whose tokens are
        then all computed, the tokens the step emits: one, or its accepted drafts and one more."""
        batch = sorted(batch, key=lambda item: item.num_new_tokens > 1)  # decodes (and drafts) first
        input_ids, positions, meta = self.prepare(batch)
        hidden = self.model(input_ids, positions, self.kv_cache.tensor, self.kv_cache.scales, meta)
        samplers = [
            (first, item)
            for first, item in zip(starts_of(batch), batch, strict=True)
            if item.seq.num_computed_tokens + item.num_new_tokens == item.seq.num_tokens
        ]
        if not samplers:
            return {}
        # A plain sequence's last row; a drafted one's every row (its last token's, then each draft's).
        rows = [
            row
            for first, item in samplers
            for row in range(first + item.num_new_tokens - 1, first + item.num_input_tokens)
        ]
        if len(rows) < len(hidden):  # a decode step's rows are all its samplers': no copy
            hidden = hidden[torch.tensor(rows, device=self.device)]
        logits = self.model.logits(hidden, kernel_rows=len(samplers))
        return self.emit(samplers, logits, meta)

    def emit(self, samplers: list[tuple[int, ScheduledSeq]], logits: torch.Tensor, meta) -> dict:
        """Sample the plain sequences together; check each draft against its rows.  logits: each
        sampler's rows in turn (one for a plain sequence, 1 + drafts for a drafted one)."""
        counts = [1 + len(item.draft_token_ids) for _, item in samplers]
        firsts = [0, *itertools.accumulate(counts)][:-1]
        plain = [index for index, count in enumerate(counts) if count == 1]
        emitted = {}
        if plain:
            # All plain (no speculation): the logits as they are; a copy of 32 x vocab floats cost a
            # decode step 1-3 ms.
            rows = logits if len(plain) == len(samplers) else logits[torch.tensor([firsts[i] for i in plain])]
            seqs = [samplers[index][1].seq for index in plain]
            chosen = sample(rows, seqs, self.generator)
            emitted = {seq: [token] for seq, token in zip(seqs, chosen, strict=True)}
        for (first, item), start, count in zip(samplers, firsts, counts, strict=True):
            if count > 1:
                rows = logits[start : start + count]
                emitted[item.seq] = accept_drafts(rows, item.seq, item.draft_token_ids, self.generator)
                if meta.importance is not None:
                    meta.importance.commit_draft(first, len(emitted[item.seq]))
        return emitted

    def prepare(self, batch: list[ScheduledSeq]) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        decodes = [item for item in batch if item.num_new_tokens == 1]
        ids, positions, blocks, offsets = [], [], [], []  # blocks, offsets: where each new token's KV goes
        meta = AttentionMetadata(torch.empty(0), torch.empty(0))
        if any(item.seq.session_id is not None for item in batch):
            meta.importance = ImportanceTracker(self.kv_cache.importance, self.block_size)
        if decodes:
            self.prepare_decodes(decodes, meta, ids, positions)
            for item in decodes:
                first = item.seq.num_computed_tokens
                self.add_slots(item.seq, range(first, first + item.num_input_tokens), blocks, offsets)
        start = meta.num_decode_tokens
        for item in batch[len(decodes) :]:
            seq, count = item.seq, item.num_new_tokens
            first = seq.num_computed_tokens
            ids += seq.token_ids[first : first + count]
            positions += seq.positions[first : first + count]
            self.add_slots(seq, range(first, first + count), blocks, offsets)
            block_table = torch.tensor(seq.block_table[: blocks_for(first + count, self.block_size)])
            meta.prefills.append(PrefillChunk(start, start + count, block_table.to(self.device), first))
            start += count
        # From Python's ints, not tensor ops: a batch-1 decode step's metadata took a dozen ops, ~50 us.
        meta.slot_blocks = torch.tensor(blocks, dtype=torch.long, device=self.device)
        meta.slot_offsets = torch.tensor(offsets, dtype=torch.long, device=self.device)
        if meta.importance is not None:
            meta.importance.start_step(meta.slot_blocks * self.block_size + meta.slot_offsets, meta)
            for first, item in zip(starts_of(decodes), decodes, strict=True):
                if item.draft_token_ids:
                    meta.importance.hold_draft(first, item.num_input_tokens)
        input_ids = torch.tensor(ids, dtype=torch.long, device=self.device)
        return input_ids, torch.tensor(positions, dtype=torch.long, device=self.device), meta

    def prepare_decodes(self, items: list[ScheduledSeq], meta: AttentionMetadata, ids: list, positions: list):
        """Single-token queries, one row each; a draft's tokens are rows too, each seeing the sequence's
        cache up to its own position (the step writes every row's KV before any row attends), so checking
        a draft costs a few more rows of a decode step."""
        rows = [
            (item.seq, item.seq.num_computed_tokens + offset)
            for item in items
            for offset in range(item.num_input_tokens)
        ]
        for item in items:
            seq, first = item.seq, item.seq.num_computed_tokens
            ids += [seq.token_ids[first], *item.draft_token_ids]
            positions += range(seq.positions[first], seq.positions[first] + item.num_input_tokens)
        width = max(len(seq.block_table) for seq, _ in rows)
        tables = [seq.block_table + [0] * (width - len(seq.block_table)) for seq, _ in rows]
        meta.num_decode_tokens = len(rows)
        meta.num_draft_tokens = sum(len(item.draft_token_ids) for item in items)
        meta.decode_block_tables = torch.tensor(tables, dtype=torch.long, device=self.device)
        meta.decode_context_lens = torch.tensor(
            [index + 1 for _, index in rows], dtype=torch.long, device=self.device
        )

    def add_slots(self, seq: Sequence, indices: range, blocks: list, offsets: list) -> None:
        """The cache block and offset that hold the KV of each of the sequence's tokens `indices`."""
        blocks += [seq.block_table[index // self.block_size] for index in indices]
        offsets += [index % self.block_size for index in indices]


def starts_of(items: list[ScheduledSeq]) -> list[int]:
    """The first row of each item in the step's flat batch (items in batch order from row 0)."""
    return [0, *itertools.accumulate(item.num_input_tokens for item in items)][: len(items)]


def attention_kernels_fit(shape: ModelShape, block_size: int) -> bool:
    group = shape.num_heads // shape.num_kv_heads
    return block_size == 16 and shape.head_dim % 32 == 0 and group <= 8
