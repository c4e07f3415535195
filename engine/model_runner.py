"""Turns a scheduled step into one flat batch, runs the model over the paged KV cache, samples."""

import torch

from engine.kernels import cpu_kernels
from engine.layers.attention import AttentionMetadata, PrefillChunk
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
            shape.num_layers, 2, num_blocks, shape.num_kv_heads, block_size * shape.head_dim,
            dtype=self.dtype, device=self.device,
        )  # fmt: skip
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        if self.device.type == "cpu" and kernels_fit(shape, block_size):
            model.kernels = cpu_kernels()

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
        samplers = [i for i, item in enumerate(batch) if item.seq.num_computed_tokens + item.num_new_tokens
                    == item.seq.num_tokens]  # fmt: skip
        if not samplers:
            return {}
        logits = self.model.logits(hidden[ends[samplers].to(self.device)])
        seqs = [batch[i].seq for i in samplers]
        return dict(zip(seqs, sample(logits, seqs, self.generator), strict=True))

    def prepare(self, batch: list[ScheduledSeq]) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        decodes = [item.seq for item in batch if item.num_new_tokens == 1]
        ids: list[int] = [seq.token_ids[seq.num_computed_tokens] for seq in decodes]
        position_parts = [torch.tensor([seq.num_computed_tokens for seq in decodes], dtype=torch.long)]
        slot_parts = []
        meta = AttentionMetadata(torch.empty(0), torch.empty(0), num_decode_tokens=len(decodes))
        if decodes:
            slot_parts.append(self.prepare_decodes(decodes, position_parts[0], meta))
        start = len(decodes)
        for item in batch[len(decodes) :]:
            seq, count = item.seq, item.num_new_tokens
            first = seq.num_computed_tokens
            ids += seq.token_ids[first : first + count]
            positions = torch.arange(first, first + count)
            block_table = torch.tensor(seq.block_table[: self.blocks_for(first + count)])
            slot_parts.append(block_table[positions // self.block_size] * self.block_size
                              + positions % self.block_size)  # fmt: skip
            position_parts.append(positions)
            context = torch.arange(first + count)
            mask = context[None, :] <= positions[:, None]
            meta.prefills.append(PrefillChunk(start, start + count, block_table.to(self.device),
                                              mask.to(self.device)))  # fmt: skip
            start += count
        slots = torch.cat(slot_parts).to(self.device)
        meta.slot_blocks, meta.slot_offsets = slots // self.block_size, slots % self.block_size
        input_ids = torch.tensor(ids, dtype=torch.long, device=self.device)
        return input_ids, torch.cat(position_parts).to(self.device), meta

    def prepare_decodes(self, seqs: list[Sequence], positions: torch.Tensor, meta: AttentionMetadata):
        width = max(len(seq.block_table) for seq in seqs)
        tables = torch.tensor([seq.block_table + [0] * (width - len(seq.block_table)) for seq in seqs])
        rows = torch.arange(len(seqs))
        slots = tables[rows, positions // self.block_size] * self.block_size + positions % self.block_size
        meta.decode_block_tables = tables.to(self.device)
        meta.decode_context_lens = (positions + 1).to(self.device)
        return slots

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)


def kernels_fit(shape: ModelShape, block_size: int) -> bool:
    group = shape.num_heads // shape.num_kv_heads
    return block_size == 16 and shape.head_dim % 32 == 0 and group <= 8
