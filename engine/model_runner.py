"""Turns a scheduled step into one flat batch, runs the model over the paged KV cache, samples.

It also owns the cache tensors: reading and writing arbitrary slots is how session KV is compressed,
saved and restored.
"""

import torch

from engine.kernels import cpu_kernels
from engine.layers.attention import AttentionMetadata, PrefillChunk
from engine.layers.importance import ImportanceTracker
from engine.models.decoder import CausalLM, ModelShape
from engine.sampler import sample
from engine.scheduler import ScheduledSeq
from engine.sequence import Sequence


class ModelRunner:
    def __init__(self, model: CausalLM, num_blocks: int, block_size: int, seed: int = 0):
        self.model = model
        self.block_size = block_size
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        shape = model.shape
        # (layers, keys/values, blocks, kv_heads, block_size * head_dim); see layers/attention.py.
        self.kv_cache = torch.zeros(
            shape.num_layers,
            2,
            num_blocks,
            shape.num_kv_heads,
            block_size * shape.head_dim,
            dtype=self.dtype,
            device=self.device,
        )
        self.importance = torch.zeros(num_blocks * block_size, device=self.device)  # attention received
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        if self.device.type == "cpu":
            model.use_kernels(cpu_kernels(), attention=attention_kernels_fit(shape, block_size))

    @staticmethod
    def bytes_per_block(model_shape: ModelShape, block_size: int, dtype: torch.dtype) -> int:
        per_token = 2 * model_shape.num_layers * model_shape.num_kv_heads * model_shape.head_dim
        return per_token * block_size * dtype.itemsize

    @torch.inference_mode()
    def run(self, batch: list[ScheduledSeq]) -> dict[Sequence, int]:
        """Compute the KV of every scheduled token; sample for sequences whose tokens are all computed."""
        batch = sorted(batch, key=lambda item: item.num_new_tokens > 1)  # single-token queries first
        input_ids, positions, meta = self.prepare(batch)
        hidden = self.model(input_ids, positions, self.kv_cache, meta)
        ends = torch.tensor([item.num_new_tokens for item in batch]).cumsum(0) - 1
        samplers = [
            i
            for i, item in enumerate(batch)
            if item.seq.num_computed_tokens + item.num_new_tokens == item.seq.num_tokens
        ]
        if not samplers:
            return {}
        logits = self.model.logits(hidden[ends[samplers].to(self.device)])
        seqs = [batch[i].seq for i in samplers]
        return dict(zip(seqs, sample(logits, seqs, self.generator), strict=True))

    def prepare(self, batch: list[ScheduledSeq]) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        decodes = [item.seq for item in batch if item.num_new_tokens == 1]
        ids: list[int] = [seq.token_ids[seq.num_computed_tokens] for seq in decodes]
        positions: list[int] = [seq.positions[seq.num_computed_tokens] for seq in decodes]
        slot_parts = []
        meta = AttentionMetadata(torch.empty(0), torch.empty(0), num_decode_tokens=len(decodes))
        if any(item.seq.session_id is not None for item in batch):
            meta.importance = ImportanceTracker(self.importance, self.block_size)
        if decodes:
            slot_parts.append(self.prepare_decodes(decodes, meta))
        start = len(decodes)
        for item in batch[len(decodes) :]:
            seq, count = item.seq, item.num_new_tokens
            first = seq.num_computed_tokens
            ids += seq.token_ids[first : first + count]
            positions += seq.positions[first : first + count]
            block_table = torch.tensor(seq.block_table[: self.blocks_for(first + count)])
            new_slots = torch.arange(first, first + count)
            slot_parts.append(
                block_table[new_slots // self.block_size] * self.block_size + new_slots % self.block_size
            )
            meta.prefills.append(PrefillChunk(start, start + count, block_table.to(self.device), first))
            start += count
        slots = torch.cat(slot_parts).to(self.device)
        meta.slot_blocks, meta.slot_offsets = slots // self.block_size, slots % self.block_size
        if meta.importance is not None:
            meta.importance.start_step(slots, meta)
        input_ids = torch.tensor(ids, dtype=torch.long, device=self.device)
        return input_ids, torch.tensor(positions, dtype=torch.long, device=self.device), meta

    def prepare_decodes(self, seqs: list[Sequence], meta: AttentionMetadata) -> torch.Tensor:
        width = max(len(seq.block_table) for seq in seqs)
        tables = torch.tensor([seq.block_table + [0] * (width - len(seq.block_table)) for seq in seqs])
        new_slots = torch.tensor([seq.num_computed_tokens for seq in seqs])
        rows = torch.arange(len(seqs))
        slots = tables[rows, new_slots // self.block_size] * self.block_size + new_slots % self.block_size
        meta.decode_block_tables = tables.to(self.device)
        meta.decode_context_lens = (new_slots + 1).to(self.device)
        return slots

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def slot_ids(self, block_ids: list[int], count: int) -> torch.Tensor:
        """The first `count` slots of a block table."""
        blocks = torch.tensor(block_ids, dtype=torch.long).repeat_interleave(self.block_size)
        offsets = torch.arange(self.block_size).repeat(len(block_ids))
        return (blocks * self.block_size + offsets)[:count].to(self.device)

    @torch.inference_mode()
    def read_slots(self, slots: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """(keys, values) as (layers, slots, kv_heads, head_dim), then the slots' importance."""
        keys, values = self.cache_views()
        blocks, offsets = slots // self.block_size, slots % self.block_size
        k = keys[:, blocks, :, :, offsets].transpose(0, 1)
        v = values[:, blocks, :, offsets, :].transpose(0, 1)
        return k, v, self.importance[slots]

    @torch.inference_mode()
    def write_slots(self, slots: torch.Tensor, k, v, importance) -> None:
        keys, values = self.cache_views()
        blocks, offsets = slots // self.block_size, slots % self.block_size
        keys[:, blocks, :, :, offsets] = k.transpose(0, 1).to(self.kv_cache)
        values[:, blocks, :, offsets, :] = v.transpose(0, 1).to(self.kv_cache)
        self.importance[slots] = importance.to(self.importance)

    def cache_views(self) -> tuple[torch.Tensor, torch.Tensor]:
        layers, _, blocks, kv_heads, width = self.kv_cache.shape
        head_dim = width // self.block_size
        keys = self.kv_cache[:, 0].view(layers, blocks, kv_heads, head_dim, self.block_size)
        values = self.kv_cache[:, 1].view(layers, blocks, kv_heads, self.block_size, head_dim)
        return keys, values


def attention_kernels_fit(shape: ModelShape, block_size: int) -> bool:
    group = shape.num_heads // shape.num_kv_heads
    return block_size == 16 and shape.head_dim % 32 == 0 and group <= 8
