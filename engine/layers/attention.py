"""Attention over the paged KV cache.

New keys and values are written to their slots first; then every query reads its sequence's keys and
values through the sequence's block table.  Single-token queries (decodes) of all sequences go through
one batched call; each multi-token prefill chunk gets its own call, which is large enough to amortise it.
"""

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F


@dataclass
class PrefillChunk:
    start: int  # first row of this chunk in the step's flat token batch
    end: int
    block_ids: torch.Tensor  # the sequence's blocks covering its context
    mask: torch.Tensor  # (chunk tokens, context tokens): causal, offset by the tokens already cached


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # (tokens,) cache slot of each new token: block_id * block_size + offset
    num_decode_tokens: int = 0  # the first rows of the batch are single-token queries
    decode_block_tables: torch.Tensor | None = None  # (decodes, max_blocks), padded with block 0
    decode_mask: torch.Tensor | None = None  # (decodes, 1, 1, max_blocks * block_size): padding masked out
    prefills: list[PrefillChunk] = field(default_factory=list)


class KVGatherBuffer:
    """Reused scratch memory for gathered keys and values: fresh large tensors cost page faults on CPU."""

    def __init__(self):
        self.storage = torch.empty(0)

    def take(self, shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
        size = 2 * torch.Size(shape).numel()
        if (
            self.storage.numel() < size
            or self.storage.dtype != like.dtype
            or self.storage.device != like.device
        ):
            self.storage = torch.empty(size, dtype=like.dtype, device=like.device)
        return self.storage[:size].view(2, *shape)


def paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv_cache: torch.Tensor,
    meta: AttentionMetadata,
    buffer: KVGatherBuffer,
) -> torch.Tensor:
    # q: (tokens, heads, head_dim); k, v: (tokens, kv_heads, head_dim)
    # kv_cache: (2, num_blocks, block_size, kv_heads, head_dim)
    flat_cache = kv_cache.view(2, -1, *kv_cache.shape[-2:])
    flat_cache[0].index_copy_(0, meta.slot_mapping, k)
    flat_cache[1].index_copy_(0, meta.slot_mapping, v)
    out = torch.empty_like(q)
    decodes = meta.num_decode_tokens
    if decodes:
        out[:decodes] = decode_attention(q[:decodes], kv_cache, meta, buffer)
    for chunk in meta.prefills:
        out[chunk.start : chunk.end] = prefill_attention(q[chunk.start : chunk.end], kv_cache, chunk, buffer)
    return out


def gather_blocks(kv_cache: torch.Tensor, block_ids: torch.Tensor, buffer: KVGatherBuffer) -> torch.Tensor:
    """(2, len(block_ids) * block_size, kv_heads, head_dim) of the given blocks, in order."""
    _, num_blocks, block_size, kv_heads, head_dim = kv_cache.shape
    gathered = buffer.take((block_ids.numel(), block_size * kv_heads * head_dim), kv_cache)
    rows = kv_cache.view(2, num_blocks, -1)
    torch.index_select(rows[0], 0, block_ids, out=gathered[0])
    torch.index_select(rows[1], 0, block_ids, out=gathered[1])
    return gathered.view(2, -1, kv_heads, head_dim)


def decode_attention(q, kv_cache, meta: AttentionMetadata, buffer: KVGatherBuffer) -> torch.Tensor:
    decodes, heads, head_dim = q.shape
    kv_heads = kv_cache.shape[-2]
    keys, values = gather_blocks(kv_cache, meta.decode_block_tables.flatten(), buffer)
    keys = keys.view(decodes, -1, kv_heads, head_dim).transpose(
        1, 2
    )  # (decodes, kv_heads, context, head_dim)
    values = values.view(decodes, -1, kv_heads, head_dim).transpose(1, 2)
    # The query heads that share a KV head ride along as extra query rows: no KV copy for GQA.
    grouped = q.view(decodes, kv_heads, heads // kv_heads, head_dim)
    out = F.scaled_dot_product_attention(grouped, keys, values, attn_mask=meta.decode_mask)
    return out.reshape(decodes, heads, head_dim)


def prefill_attention(q, kv_cache, chunk: PrefillChunk, buffer: KVGatherBuffer) -> torch.Tensor:
    context = chunk.mask.shape[1]
    keys, values = gather_blocks(kv_cache, chunk.block_ids, buffer)
    keys = keys[:context].transpose(0, 1).unsqueeze(0)  # (1, kv_heads, context, head_dim)
    values = values[:context].transpose(0, 1).unsqueeze(0)
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1).unsqueeze(0), keys, values, attn_mask=chunk.mask, enable_gqa=True
    )
    return out.squeeze(0).transpose(0, 1)
