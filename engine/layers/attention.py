"""Attention over the paged KV cache.

New keys and values are written to their slots first; then every query reads its sequence's keys and
values through the sequence's block table.  Single-token queries (decodes) of all sequences go through
one batched call; each multi-token prefill chunk gets its own call, large enough to amortise.  On the CPU
both are our C++ kernels, which read the blocks in place; elsewhere, gathered blocks and torch's SDPA.
Our prefill kernel computes a row to the same bits however its prompt is cut into chunks, which torch's
SDPA does not (its softmax runs over key blocks sized by the call), so the CPU keeps it for every chunk
even where SDPA is faster (AMX tiles: 512 rows over 1,024 tokens took 2.6 ms against our 6.5, about 8 %
of a prefill-only run of bench.throughput's offline prompts): a reply does not depend on load.

Layout of one layer's cache, (2, blocks, kv_heads, block_size * head_dim): keys are stored transposed
per block, (head_dim, block_size), values as (block_size, head_dim); see kernels/paged_attention_cpu.cpp.
An int8 cache has the same layout and a float32 scale per token and KV head, (2, blocks, kv_heads,
block_size); the kernels fold the scales into q.k and into the probabilities, so no float copy is made.
"""

import functools
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from engine.layers.importance import WINDOW, ImportanceTracker, window_attention_received
from engine.quantization import quantize_int8


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
    num_draft_tokens: int = 0  # rows that check speculative drafts

    @property
    def kernel_rows(self) -> int:
        """The rows by which products choose their kernel: the step's rows without its drafts.  Each
        kernel computes a row to the same bits whatever rows come with it, so a drafted step computes its
        rows as the step without drafts would, and greedy replies stay those without speculation."""
        return self.slot_blocks.shape[0] - self.num_draft_tokens


@dataclass
class LayerCache:
    """One layer's paged KV: the cache (2, blocks, kv_heads, block_size * head_dim) and, for an int8
    cache, the scale of each token and KV head (2, blocks, kv_heads, block_size) float32."""

    tensor: torch.Tensor
    scales: torch.Tensor | None
    head_dim: int

    @property
    def keys(self) -> torch.Tensor:
        """(blocks, kv_heads, head_dim, block_size)"""
        blocks, kv_heads, width = self.tensor.shape[1:]
        return self.tensor[0].view(blocks, kv_heads, self.head_dim, width // self.head_dim)

    @property
    def values(self) -> torch.Tensor:
        """(blocks, kv_heads, block_size, head_dim)"""
        blocks, kv_heads, width = self.tensor.shape[1:]
        return self.tensor[1].view(blocks, kv_heads, width // self.head_dim, self.head_dim)

    def scales_of(self, index: int) -> torch.Tensor | None:
        """Keys' (0) or values' (1) scales, (blocks, kv_heads, block_size); None unless int8."""
        return self.scales[index] if self.scales is not None else None

    def write(self, k, v, meta: AttentionMetadata) -> None:
        """The torch path's write; kernels.write_kv does the same in C++."""
        blocks, offsets = meta.slot_blocks, meta.slot_offsets
        if self.scales is not None:
            (k, key_scales), (v, value_scales) = quantize_int8(k), quantize_int8(v)
            self.scales[0, blocks, :, offsets] = key_scales
            self.scales[1, blocks, :, offsets] = value_scales
        self.keys[blocks, :, :, offsets] = k
        self.values[blocks, :, offsets, :] = v

    def gather(self, block_ids: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of the given blocks in token order, in `dtype`: (..., kv_heads, tokens,
        head_dim)."""
        keys = self.keys[block_ids].transpose(-1, -2).transpose(-3, -4)  # (..., kv_heads, blocks, bs, hd)
        values = self.values[block_ids].transpose(-3, -4)
        keys, values = keys.flatten(-3, -2), values.flatten(-3, -2)
        if self.scales is None:
            return keys, values
        # (..., blocks, kv_heads, bs) -> (..., kv_heads, tokens, 1)
        key_scales, value_scales = (
            self.scales[i][block_ids].transpose(-2, -3).flatten(-2)[..., None] for i in (0, 1)
        )
        return (keys * key_scales).to(dtype), (values * value_scales).to(dtype)


def paged_attention(q, k, v, cache: LayerCache, meta: AttentionMetadata, kernels) -> torch.Tensor:
    # q: (tokens, heads, head_dim); k, v: (tokens, kv_heads, head_dim)
    if kernels is not None:
        kernels.write_kv(k, v, cache.tensor, meta.slot_blocks, meta.slot_offsets, cache.scales)
    else:
        cache.write(k, v, meta)
    decodes = meta.num_decode_tokens
    attend = kernel_decode_attention if kernels is not None else torch_decode_attention
    prefill = kernel_prefill_attention if kernels is not None else torch_prefill_attention
    if not meta.prefills:  # a pure decode step: nothing to assemble
        return attend(q, cache, meta, kernels)
    out = torch.empty_like(q)
    if decodes:
        out[:decodes] = attend(q[:decodes], cache, meta, kernels)
    for index, chunk in enumerate(meta.prefills):
        rows = slice(chunk.start, chunk.end)
        out[rows] = prefill(q[rows], k[rows], v[rows], cache, chunk, index, meta.importance, kernels)
    return out


def kernel_decode_attention(q, cache: LayerCache, meta: AttentionMetadata, kernels) -> torch.Tensor:
    out, received = kernels.paged_decode_attention(
        q,
        cache.keys,
        cache.values,
        meta.decode_block_tables,
        meta.decode_context_lens,
        q.shape[-1] ** -0.5,
        cache.scales_of(0),
        cache.scales_of(1),
        meta.importance is not None,
    )
    if meta.importance is not None:
        meta.importance.add_decode(received)
    return out


def torch_decode_attention(q, cache: LayerCache, meta: AttentionMetadata, kernels=None) -> torch.Tensor:
    decodes, heads, head_dim = q.shape
    keys, values = cache.gather(meta.decode_block_tables, q.dtype)
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


def kernel_prefill_attention(q, k, v, cache: LayerCache, chunk: PrefillChunk, index, importance, kernels):
    """Reads the chunk's keys and values where write_kv put them; k and v are the torch path's."""
    window = WINDOW if importance is not None else 0
    out, received = kernels.paged_prefill_attention(
        q,
        cache.keys,
        cache.values,
        chunk.block_ids,
        chunk.num_cached,
        q.shape[-1] ** -0.5,
        window,
        cache.scales_of(0),
        cache.scales_of(1),
    )
    if importance is not None:
        importance.add_prefill(index, received)
    return out


def torch_prefill_attention(q, k, v, cache: LayerCache, chunk: PrefillChunk, index, importance, kernels=None):
    """k, v: the chunk's own (tokens, kv_heads, head_dim).  With nothing cached before it (and a cache
    that stores them as they are) they are the whole context, and the blocks need no gathering: 512 rows
    took 0.84 ms against 0.98 on a 2-core AMX Xeon."""
    first_chunk = chunk.num_cached == 0
    if first_chunk and cache.scales is None:
        keys, values = k.transpose(0, 1), v.transpose(0, 1)
    else:
        keys, values = cache.gather(chunk.block_ids, q.dtype)
        keys, values = keys[:, : chunk.context], values[:, : chunk.context]
    # With nothing cached, the mask is SDPA's own causal one, which lets it skip the blocks above the
    # diagonal instead of computing them to mask them out.
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1).unsqueeze(0),
        keys.unsqueeze(0),
        values.unsqueeze(0),
        attn_mask=None if first_chunk else chunk.mask,
        is_causal=first_chunk,
        enable_gqa=True,
    )
    if importance is not None:
        importance.add_prefill(index, window_attention_received(q, keys, chunk.mask))
    return out.squeeze(0).transpose(0, 1)
