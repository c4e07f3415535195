"""Attention over the paged KV cache.

New keys and values are written to their slots first; then every query reads its sequence's keys and
values through the sequence's block table.  Single-token queries (decodes) of all sequences go through
one batched call; each multi-token prefill chunk gets its own call, large enough to amortise.  On the CPU
both are our C++ kernels, which read the blocks in place; elsewhere, gathered blocks and torch's SDPA.

Layout of one layer's cache, (2, blocks, kv_heads, block_size * head_dim): keys are stored transposed
per block, (head_dim, block_size), values as (block_size, head_dim); see kernels/paged_attention_cpu.cpp.
"""

import functools
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from engine.layers.importance import WINDOW, ImportanceTracker, window_attention_received


@dataclass
class PrefillChunk:
    start: int  # first row of this chunk in the step's flat token batch
    end: int
    block_ids: torch.Tensor  # the sequence's blocks covering its context
    num_cached: int  # the sequence's tokens already in the cache before this chunk

    @property
    def context(self) -> int:
        return self.num_cached + self.end - self.start

    @functools.cached_property
    def mask(self) -> torch.Tensor:
        """(chunk tokens, context tokens), causal: built only for the torch path, once per step."""
        positions = torch.arange(self.context, device=self.block_ids.device)
        return positions[None, :] <= positions[self.num_cached :, None]


@dataclass
class AttentionMetadata:
    slot_blocks: torch.Tensor  # (tokens,) block of each new token's KV
    slot_offsets: torch.Tensor  # (tokens,) its offset inside the block
    num_decode_tokens: int = 0  # the first rows of the batch are single-token queries
    decode_block_tables: torch.Tensor | None = None  # (decodes, max_blocks), padded with block 0
    decode_context_lens: torch.Tensor | None = None  # (decodes,)
    prefills: list[PrefillChunk] = field(default_factory=list)
    importance: ImportanceTracker | None = None  # set when a session's tokens may be evicted later


def split_layer_cache(layer_cache: torch.Tensor, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(keys (blocks, kv_heads, head_dim, block_size), values (blocks, kv_heads, block_size, head_dim))."""
    blocks, kv_heads, width = layer_cache.shape[1:]
    block_size = width // head_dim
    keys = layer_cache[0].view(blocks, kv_heads, head_dim, block_size)
    values = layer_cache[1].view(blocks, kv_heads, block_size, head_dim)
    return keys, values


def paged_attention(q, k, v, layer_cache: torch.Tensor, meta: AttentionMetadata, kernels) -> torch.Tensor:
    # q: (tokens, heads, head_dim); k, v: (tokens, kv_heads, head_dim)
    key_cache, value_cache = split_layer_cache(layer_cache, q.shape[-1])
    if kernels is not None:
        kernels.write_kv(k, v, layer_cache, meta.slot_blocks, meta.slot_offsets)
    else:
        key_cache[meta.slot_blocks, :, :, meta.slot_offsets] = k
        value_cache[meta.slot_blocks, :, meta.slot_offsets, :] = v
    decodes = meta.num_decode_tokens
    attend = kernel_decode_attention if kernels is not None else torch_decode_attention
    prefill = kernel_prefill_attention if kernels is not None else torch_prefill_attention
    if not meta.prefills:  # a pure decode step: nothing to assemble
        return attend(q, key_cache, value_cache, meta, kernels)
    out = torch.empty_like(q)
    if decodes:
        out[:decodes] = attend(q[:decodes], key_cache, value_cache, meta, kernels)
    for index, chunk in enumerate(meta.prefills):
        out[chunk.start : chunk.end] = prefill(
            q[chunk.start : chunk.end], key_cache, value_cache, chunk, index, meta.importance, kernels
        )
    return out


def gather_context(key_cache, value_cache, block_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values of the given blocks in token order: (..., kv_heads, tokens, head_dim)."""
    keys = key_cache[block_ids].transpose(-1, -2).transpose(-3, -4)  # (..., kv_heads, blocks, bs, head_dim)
    values = value_cache[block_ids].transpose(-3, -4)
    return keys.flatten(-3, -2), values.flatten(-3, -2)


def kernel_decode_attention(q, key_cache, value_cache, meta: AttentionMetadata, kernels) -> torch.Tensor:
    tables, lens = meta.decode_block_tables, meta.decode_context_lens
    max_context = tables.shape[1] * key_cache.shape[-1]
    probs = kernels.paged_qk(q, key_cache, tables, lens, max_context, q.shape[-1] ** -0.5).softmax(dim=-1)
    if meta.importance is not None:
        meta.importance.add_decode(probs.sum(dim=1))
    return kernels.paged_pv(probs, value_cache, tables, lens)


def torch_decode_attention(q, key_cache, value_cache, meta: AttentionMetadata, kernels=None) -> torch.Tensor:
    decodes, heads, head_dim = q.shape
    keys, values = gather_context(key_cache, value_cache, meta.decode_block_tables)
    kv_heads = keys.shape[1]
    positions = torch.arange(keys.shape[2], device=q.device)
    mask = (positions[None, :] < meta.decode_context_lens[:, None])[:, None, None, :]
    # The query heads that share a KV head ride along as extra query rows: no KV copy for GQA.
    grouped = q.view(decodes, kv_heads, heads // kv_heads, head_dim)
    if meta.importance is None:
        out = F.scaled_dot_product_attention(grouped, keys, values, attn_mask=mask)
    else:  # fused SDPA hides the probabilities that importance needs
        scores = (grouped @ keys.transpose(-1, -2)) * head_dim**-0.5
        probs = scores.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        meta.importance.add_decode(probs.sum(dim=(1, 2)))
        out = probs.to(values.dtype) @ values
    return out.reshape(decodes, heads, head_dim)


def kernel_prefill_attention(q, key_cache, value_cache, chunk: PrefillChunk, index, importance, kernels):
    window = WINDOW if importance is not None else 0
    out, received = kernels.paged_prefill_attention(
        q, key_cache, value_cache, chunk.block_ids, chunk.num_cached, q.shape[-1] ** -0.5, window
    )
    if importance is not None:
        importance.add_prefill(index, received)
    return out


def torch_prefill_attention(
    q, key_cache, value_cache, chunk: PrefillChunk, index: int, importance, kernels=None
):
    context = chunk.context
    keys, values = gather_context(key_cache, value_cache, chunk.block_ids)
    keys, values = keys[:, :context], values[:, :context]
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1).unsqueeze(0),
        keys.unsqueeze(0),
        values.unsqueeze(0),
        attn_mask=chunk.mask,
        enable_gqa=True,
    )
    if importance is not None:
        importance.add_prefill(index, window_attention_received(q, keys, chunk.mask))
    return out.squeeze(0).transpose(0, 1)
