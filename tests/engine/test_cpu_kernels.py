"""Our C++ CPU kernels match the torch path: decode and prefill attention (over caches of the compute
dtype and over int8 caches), few-row linears, norms, rotary, KV writes."""

import math
import sys

import pytest
import torch
import torch.nn.functional as F
from safetensors import safe_open
from transformers import LlamaConfig

from engine import LLM, SamplingParams
from engine.config import EngineConfig, cpu_has_avx512
from engine.kernels import cpu_kernels
from engine.layers.attention import (
    AttentionMetadata,
    LayerCache,
    PrefillChunk,
    kernel_decode_attention,
    kernel_prefill_attention,
    torch_decode_attention,
    torch_prefill_attention,
)
from engine.layers.importance import WINDOW, ImportanceTracker
from engine.layers.linear import Linear
from engine.layers.norm import RMSNorm
from engine.layers.rotary import RotaryEmbedding
from engine.llm_engine import LLMEngine
from engine.model_files import weight_files
from engine.quantization import dequantize_int8, quantize_int8
from engine.testing.oracle import VARIANTS
from engine.testing.tiny_models import TINY_CONFIGS, build_model

BLOCK = 16
NUMERIC_VARIANTS = {name: options for name, options in VARIANTS.items() if "speculative" not in options}
KV_DTYPES = ["auto", "int8"]


def random_cache(num_blocks, kv_heads, head_dim, dtype, kv_cache_dtype, generator) -> LayerCache:
    """Random keys and values as the layer stores them: in `dtype`, or as int8 with their scales."""
    tensor = torch.randn(2, num_blocks, kv_heads, BLOCK * head_dim, generator=generator).to(dtype)
    cache = LayerCache(tensor, None, head_dim)
    if kv_cache_dtype == "auto":
        return cache
    keys, key_scales = quantize_int8(cache.keys.transpose(-1, -2))  # per token: along head_dim
    values, value_scales = quantize_int8(cache.values)
    tensor = torch.stack([keys.transpose(-1, -2).flatten(-2), values.flatten(-2)])
    return LayerCache(tensor, torch.stack([key_scales, value_scales]), head_dim)


def float_keys_values(cache: LayerCache) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys (blocks, kv_heads, head_dim, 16) and values (blocks, kv_heads, 16, head_dim) in float32."""
    if cache.scales is None:
        return cache.keys.float(), cache.values.float()
    keys = dequantize_int8(cache.keys.transpose(-1, -2), cache.scales[0]).transpose(-1, -2)
    return keys, dequantize_int8(cache.values, cache.scales[1])


def random_case(seqs, heads, kv_heads, head_dim, max_len, dtype, kv_cache_dtype="auto", seed=0):
    generator = torch.Generator().manual_seed(seed)
    num_blocks = seqs * (max_len // BLOCK + 1) + 3
    cache = random_cache(num_blocks, kv_heads, head_dim, dtype, kv_cache_dtype, generator)
    lens = torch.randint(1, max_len + 1, (seqs,), generator=generator)
    width = int((lens.max() + BLOCK - 1) // BLOCK)
    tables = torch.randperm(num_blocks, generator=generator)[: seqs * width].view(seqs, width)
    q = torch.randn(seqs, heads, head_dim, generator=generator).to(dtype)
    meta = AttentionMetadata(torch.empty(0), torch.empty(0), seqs, tables, lens)
    return q, cache, meta


def plain_attention(q, cache: LayerCache, meta):
    """Attention for each sequence alone, reading its tokens one by one from the blocks; also each
    sequence's probabilities summed over heads, (seqs, max_context), 0 past its context."""
    keys, values = float_keys_values(cache)
    tables = meta.decode_block_tables
    outputs, received = [], torch.zeros(len(tables), tables.shape[1] * BLOCK)
    for row, length in enumerate(meta.decode_context_lens.tolist()):
        slots = [(tables[row, t // BLOCK], t % BLOCK) for t in range(length)]
        k = torch.stack([keys[b, :, :, o] for b, o in slots], dim=1)  # (kv_heads, tokens, head_dim)
        v = torch.stack([values[b, :, o, :] for b, o in slots], dim=1)
        group = q.shape[1] // k.shape[0]
        k, v = k.repeat_interleave(group, dim=0), v.repeat_interleave(group, dim=0)
        probs = ((q[row].float()[:, None, :] @ k.transpose(1, 2)) * q.shape[-1] ** -0.5).softmax(-1)
        outputs.append((probs @ v)[:, 0])
        received[row, :length] = probs.sum(dim=(0, 1))
    return torch.stack(outputs), received


@pytest.mark.parametrize("heads, kv_heads, head_dim", [(9, 3, 64), (4, 2, 32), (8, 1, 128), (4, 4, 64)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kv_cache_dtype", KV_DTYPES)
def test_decode_paths_match_plain_attention(heads, kv_heads, head_dim, dtype, kv_cache_dtype):
    kernels = cpu_kernels()
    assert kernels is not None, "the C++ kernels did not build"
    q, cache, meta = random_case(5, heads, kv_heads, head_dim, 300, dtype, kv_cache_dtype)  # spans of 128
    expected, expected_received = plain_attention(q, cache, meta)
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    for attend in kernel_decode_attention, torch_decode_attention:
        store = torch.zeros(cache.tensor.shape[1] * BLOCK)
        meta.importance = ImportanceTracker(store, BLOCK)
        meta.importance.start_step(torch.empty(0, dtype=torch.long), meta)
        got = attend(q, cache, meta, kernels)
        assert got.dtype == dtype
        torch.testing.assert_close(got.float(), expected, atol=tolerance, rtol=tolerance)
        slots = meta.importance.decode_slots
        expected_store = torch.zeros_like(store).index_add_(0, slots.flatten(), expected_received.flatten())
        torch.testing.assert_close(store, expected_store, atol=1e-5, rtol=tolerance)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kv_cache_dtype", KV_DTYPES)
def test_a_drafted_sequences_rows_read_together_keep_the_bits_of_each_row_alone(dtype, kv_cache_dtype):
    """A step checking a draft has a row per draft token, with the sequence's table and one more token of
    context each; the kernel reads the blocks once for several of them, and each row must still be what
    it is alone (speculation keeps greedy replies exact only so)."""
    kernels = cpu_kernels()
    q, cache, meta = random_case(3, 9, 3, 64, 300, dtype, kv_cache_dtype)
    drafts = [7, 0, 3]  # rows after each sequence's last token: more than one item's worth, none, a few
    rows = [(seq, extra) for seq, count in enumerate(drafts) for extra in range(1 + count)]
    # One more block each, for the draft tokens that spill past the sequence's last one.
    tables = torch.cat([meta.decode_block_tables, torch.tensor([[len(cache.tensor[0]) - 1]] * 3)], dim=1)
    meta.decode_block_tables = tables[[seq for seq, _ in rows]].contiguous()
    meta.decode_context_lens = torch.tensor([int(meta.decode_context_lens[s]) + e for s, e in rows])
    q = torch.randn(len(rows), 9, 64, generator=torch.Generator().manual_seed(1)).to(dtype)
    together = kernel_decode_attention(q, cache, meta, kernels)
    expected, _ = plain_attention(q, cache, meta)
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(together.float(), expected, atol=tolerance, rtol=tolerance)
    for row in range(len(rows)):
        alone = AttentionMetadata(
            torch.empty(0),
            torch.empty(0),
            1,
            meta.decode_block_tables[row : row + 1],
            meta.decode_context_lens[row : row + 1],
        )
        assert torch.equal(
            kernel_decode_attention(q[row : row + 1], cache, alone, kernels), together[row : row + 1]
        )


@pytest.mark.parametrize("kv_cache_dtype", KV_DTYPES)
def test_a_rows_bits_do_not_depend_on_how_many_threads_share_its_context(kv_cache_dtype):
    """Threads share a long context's spans of 128 tokens (one sequence has too few KV heads to keep every
    core busy), more threads than cores included; a row must come out the same bits however its spans
    were shared, as it does alone."""
    kernels = cpu_kernels()
    q, cache, meta = random_case(2, 9, 3, 64, 700, torch.bfloat16, kv_cache_dtype)
    threads = torch.get_num_threads()
    outputs = []
    try:
        for count in (1, 2, 3, 5):
            torch.set_num_threads(count)
            outputs.append(kernel_decode_attention(q, cache, meta, kernels))
            tables, lens = meta.decode_block_tables[:1], meta.decode_context_lens[:1]
            first = AttentionMetadata(torch.empty(0), torch.empty(0), 1, tables, lens)
            assert torch.equal(kernel_decode_attention(q[:1], cache, first, kernels), outputs[-1][:1])
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(got, outputs[0]) for got in outputs[1:])


def plain_prefill(q, cache: LayerCache, block_ids, cached):
    """Each chunk position alone, with an explicit softmax over the tokens it may see, read one by one;
    also the probabilities of the last WINDOW positions summed over them and their heads."""
    keys, values = float_keys_values(cache)
    context = cached + q.shape[0]
    slots = [(block_ids[t // BLOCK], t % BLOCK) for t in range(context)]
    k = torch.stack([keys[b, :, :, o] for b, o in slots], dim=1)  # (kv_heads, context, head_dim)
    v = torch.stack([values[b, :, o, :] for b, o in slots], dim=1)
    group = q.shape[1] // k.shape[0]
    k, v = k.repeat_interleave(group, dim=0), v.repeat_interleave(group, dim=0)
    outputs, received = [], torch.zeros(context)
    for i in range(q.shape[0]):
        seen = cached + i + 1
        probs = ((q[i].float()[:, None, :] @ k[:, :seen].transpose(1, 2)) * q.shape[-1] ** -0.5).softmax(-1)
        outputs.append((probs @ v[:, :seen])[:, 0])
        if i >= q.shape[0] - WINDOW:
            received[:seen] += probs.sum(dim=(0, 1))
    return torch.stack(outputs), received


def poison_past_context(cache: LayerCache, block_ids, context):
    """NaN in the last block's slots past the context (a float cache's): a pool's free slots hold anything,
    and a kernel that reads them must give them no weight without multiplying them by 0."""
    if cache.scales is None and context % BLOCK:
        last = block_ids[-1]
        cache.keys[last, :, :, context % BLOCK :] = float("nan")
        cache.values[last, :, context % BLOCK :, :] = float("nan")


@pytest.mark.parametrize("heads, kv_heads, head_dim", [(9, 3, 64), (4, 2, 32), (8, 1, 128), (4, 4, 64)])
@pytest.mark.parametrize("chunk, cached", [(1, 0), (45, 0), (7, 33), (40, 200)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kv_cache_dtype", KV_DTYPES)
def test_prefill_paths_match_plain_attention(heads, kv_heads, head_dim, chunk, cached, dtype, kv_cache_dtype):
    generator = torch.Generator().manual_seed(chunk + cached)
    context = cached + chunk
    num_blocks = context // BLOCK + 4
    cache = random_cache(num_blocks, kv_heads, head_dim, dtype, kv_cache_dtype, generator)
    block_ids = torch.randperm(num_blocks, generator=generator)[: -(-context // BLOCK)]
    poison_past_context(cache, block_ids, context)
    # q as the model makes it: a view into the fused qkv projection's rows
    q = torch.randn(chunk, heads + 2 * kv_heads, head_dim, generator=generator).to(dtype)[:, :heads]
    expected, expected_received = plain_prefill(q, cache, block_ids, cached)
    keys, values = cache.gather(block_ids, dtype)  # the chunk's own keys and values, as written
    k_new, v_new = (t[:, cached:context].transpose(0, 1) for t in (keys, values))
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    for attend in kernel_prefill_attention, torch_prefill_attention:
        store = torch.zeros(num_blocks * BLOCK)
        tracker = ImportanceTracker(store, BLOCK)
        prefill = PrefillChunk(0, chunk, block_ids, cached)
        meta = AttentionMetadata(torch.empty(0), torch.empty(0), prefills=[prefill])
        tracker.start_step(torch.empty(0, dtype=torch.long), meta)
        out = attend(q, k_new, v_new, cache, prefill, 0, tracker, cpu_kernels())
        assert out.dtype == dtype and out.shape == (chunk, heads, head_dim)
        torch.testing.assert_close(out.float(), expected, atol=tolerance, rtol=tolerance)
        slots = tracker.slots_of(block_ids, context)
        torch.testing.assert_close(store[slots], expected_received, atol=1e-5, rtol=tolerance)
        assert store.sum() == pytest.approx(store[slots].sum())  # nothing outside the context


@pytest.mark.parametrize("variant", VARIANTS.values(), ids=VARIANTS.keys())
def test_the_engine_uses_the_kernels_and_the_torch_path_gives_the_same_tokens(smollm2_dir, oracle, variant):
    prompts, _ = oracle("smollm2", 24, **variant)
    llm = LLM(str(smollm2_dir), dtype="float32", num_kv_blocks=512, **variant)
    model = llm.engine.runner.model
    assert model.layers[0].self_attn.kernels is not None and model.lm_head.kernels is not None
    model.use_kernels(None, attention=False)  # what a CUDA device (or a machine without a compiler) runs
    outputs = llm.generate(prompts[:3], SamplingParams(temperature=0, max_tokens=24))
    oracle.assert_matches("smollm2", [o.outputs[0].token_ids for o in outputs], variant)


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 11, 64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_few_rows_linear_matches_torch(rows, dtype):
    kernels = cpu_kernels()
    generator = torch.Generator().manual_seed(rows)
    for in_features, out_features in [(576, 960), (100, 37), (120, 5)]:  # the tails past whole vectors
        x = torch.randn(rows, in_features, generator=generator).to(dtype)
        weight = torch.randn(out_features, in_features, generator=generator).to(dtype)
        bias = torch.randn(out_features, generator=generator).to(dtype)
        expected = F.linear(x.float(), weight.float(), bias.float())
        tolerance = 1e-4 if dtype == torch.float32 else 2e-2
        for got, want in [
            (kernels.few_rows_linear(x, weight, bias), expected),
            (kernels.few_rows_linear(x, weight, None), expected - bias.float()),
        ]:
            assert got.dtype == dtype and got.shape == (rows, out_features)
            torch.testing.assert_close(got.float(), want, atol=tolerance * in_features**0.5, rtol=tolerance)


# int8 weights with float32 x: a float32 output shows every bit, where bf16 rounding hides most; with
# float16 x (the integer path on AVX2), a float16 output shows 11 bits.
@pytest.mark.parametrize(
    "weights, dtype",
    [
        ("float32", torch.float32),
        ("bfloat16", torch.bfloat16),
        ("int8", torch.float32),
        ("int8", torch.float16),
    ],
)
def test_a_few_row_products_row_has_the_same_bits_whatever_rows_share_the_call(weights, dtype):
    """Decode steps of any batch rely on it (AttentionMetadata.kernel_rows): rows pass over a work item's
    weights a few at a time (passes of up to 6, or 4 for int8 on AVX-512), and a row's sum must be the
    same chain of instructions in any pass."""
    kernels = cpu_kernels()
    generator = torch.Generator().manual_seed(5)
    x = torch.randn(64, 580, generator=generator).to(dtype)  # 580: a tail past whole vectors
    # 259 columns: work items of 16 end with 3, fewer than a tile of several columns takes
    weight, scale = torch.randn(259, 580, generator=generator).to(dtype), None
    if weights == "int8":
        weight, scale = quantize_int8(weight)
    alone = torch.cat([kernels.few_rows_linear(x[row : row + 1], weight, None, scale) for row in range(64)])
    for rows in range(2, 14):
        assert torch.equal(kernels.few_rows_linear(x[:rows], weight, None, scale), alone[:rows]), rows
    assert torch.equal(kernels.few_rows_linear(x, weight, None, scale), alone)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_norm_rotary_and_cache_write_kernels_match_the_torch_path(dtype):
    kernels = cpu_kernels()
    generator = torch.Generator().manual_seed(0)
    exact = dtype == torch.float32
    tolerance = {"atol": 1e-6, "rtol": 1e-5} if exact else {"atol": 2e-2, "rtol": 2e-2}

    norm, head_norm = RMSNorm(96, 1e-5).to(dtype), RMSNorm(32, 1e-6).to(dtype)
    for module in norm, head_norm:
        module.weight.data = torch.randn(module.weight.shape, generator=generator).to(dtype)
    x, residual = (torch.randn(5, 96, generator=generator).to(dtype) for _ in range(2))
    expected_x, expected_residual = norm(x, residual)
    expected_heads = head_norm(x.view(5, 3, 32))  # Qwen3's per-head norm: more than two dimensions
    norm.kernels = head_norm.kernels = kernels
    torch.testing.assert_close(head_norm(x.view(5, 3, 32)), expected_heads, **tolerance)
    got_x, got_residual = norm(x.clone(), residual.clone())
    torch.testing.assert_close(got_residual, expected_residual, atol=0, rtol=0)
    torch.testing.assert_close(got_x, expected_x, **tolerance)

    rotary = RotaryEmbedding(LlamaConfig(head_dim=64, rope_theta=10000.0), 64, max_len=300).to(dtype)
    qkv = torch.randn(5, (4 + 2 * 2) * 64, generator=generator).to(
        dtype
    )  # q and k are views, as in the model
    q, k = qkv[:, : 4 * 64].view(5, 4, 64), qkv[:, 4 * 64 : 6 * 64].view(5, 2, 64)
    positions = torch.tensor([0, 7, 8, 100, 299])
    expected_q, expected_k = rotary(positions, q, k)
    rotary.kernels = kernels
    got_q, got_k = rotary(positions, q, k)
    assert got_q.data_ptr() == q.data_ptr(), "the kernel rotates in place"
    torch.testing.assert_close(got_q, expected_q, **tolerance)
    torch.testing.assert_close(got_k, expected_k, **tolerance)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("width", [49152, 1007, 5, 1])  # SmolLM2's vocabulary; a tail past the vectors; none
def test_argmax_rows_picks_what_torchs_max_picks(dtype, width):
    generator = torch.Generator().manual_seed(width)
    x = torch.randn(33, width, generator=generator).to(dtype)
    x[1] = 1.0  # all equal: the first
    x[2, [width // 3, width // 2, width - 1]] = 50.0  # equal maxima in different lanes: the first
    x[3] = float("-inf")
    x[4, width // 2] = float("nan")  # torch's max takes a NaN as the maximum
    x[5, [width - 1, width // 2]] = float("nan")  # the first NaN, after a larger value
    x[5, 0] = 1e30
    x[6, -1] = 1e30  # the maximum in the tail
    got = cpu_kernels().argmax_rows(x)
    assert got.dtype == torch.long and torch.equal(got, x.max(dim=-1).indices)
    assert torch.equal(cpu_kernels().argmax_rows(x[:1]), x[:1].max(dim=-1).indices)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_silu_and_mul_computes_and_rounds_as_torchs_two_ops(dtype):
    generator = torch.Generator().manual_seed(0)
    x = (4 * torch.randn(33, 2 * 1007, generator=generator)).to(dtype)  # 1,007: a tail past the vectors
    x[0, :6] = torch.tensor([-100.0, -88.5, 0.0, 88.5, 100.0, -1e-3])  # past e^88 and around 0
    gate, up = x.chunk(2, dim=-1)
    expected = F.silu(gate) * up
    got = cpu_kernels().silu_and_mul(x)
    assert got.dtype == dtype and got.shape == expected.shape
    # torch's exp and ours part by an ulp or two of float32, which rounding to bf16 hides; silu is 0 for
    # gates below -88 in ours and below -88.7 in torch's (between, it is below 1e-36)
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-6 if dtype == torch.float32 else 0)
    parted = got != expected
    assert parted.sum() <= got.numel() // 50
    assert dtype == torch.float32 or (expected[parted].abs() < 1e-35).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cache_write_kernel_matches_the_torch_path(dtype):
    kernels = cpu_kernels()
    generator = torch.Generator().manual_seed(1)
    k, v = (torch.randn(5, 2, 64, generator=generator).to(dtype) for _ in range(2))
    slot_blocks, slot_offsets = torch.tensor([5, 0, 5, 2, 3]), torch.tensor([0, 15, 1, 7, 9])
    meta = AttentionMetadata(slot_blocks, slot_offsets)
    for cache_dtype in dtype, torch.int8:  # an int8 cache: quantized in C++ exactly as in torch
        scales = torch.zeros(2, 6, 2, BLOCK) if cache_dtype == torch.int8 else None
        expected = LayerCache(torch.zeros(2, 6, 2, BLOCK * 64, dtype=cache_dtype), scales, 64)
        got = LayerCache(expected.tensor.clone(), scales.clone() if scales is not None else None, 64)
        expected.write(k, v, meta)
        kernels.write_kv(k, v, got.tensor, meta.slot_blocks, meta.slot_offsets, got.scales)
        assert torch.equal(got.tensor, expected.tensor)
        assert scales is None or torch.equal(got.scales, expected.scales)


@pytest.mark.parametrize("rows", [1, 100])
def test_a_bf16_product_is_a_float32_product_rounded_once(rows):
    """Packed for the CPU's bf16 units where it has them; elsewhere past the few-row kernel's rows, torch,
    widened to float32 where the CPU has no bf16 units."""
    generator = torch.Generator().manual_seed(2)
    layer = Linear(576, 960, bias=True).to(torch.bfloat16)
    x = torch.randn(rows, 576, generator=generator).to(torch.bfloat16)
    expected = F.linear(x.float(), layer.weight.float(), layer.bias.float())
    layer.use_kernels(cpu_kernels(), torch.bfloat16)
    got = layer(x)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), expected, atol=2e-2 * 576**0.5, rtol=2e-2)


@pytest.mark.parametrize("rows", [1, 8, 9, 100])
def test_a_float32_product_is_exact_to_float32_on_every_path(rows):
    """Up to the few-row kernel's rows, that kernel; past them oneDNN with the weight reordered once, where
    the CPU has AVX-512, else torch."""
    generator = torch.Generator().manual_seed(3)
    layer = Linear(576, 960, bias=True)
    x = torch.randn(rows, 576, generator=generator)
    expected = F.linear(x.double(), layer.weight.double(), layer.bias.double())
    kernels = cpu_kernels()
    layer.use_kernels(kernels, torch.float32)
    on_onednn = kernels is not None and cpu_has_avx512() and torch.backends.mkldnn.is_available()
    assert (layer.onednn is not None) == on_onednn
    got = layer(x)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), expected, atol=1e-5 * 576**0.5, rtol=1e-5)


PACKED = cpu_kernels() is not None and cpu_kernels().packed_linear_available()


def packed_weight(kernels, weight: torch.Tensor, int8: bool) -> tuple[torch.Tensor, dict, torch.Tensor]:
    """(packed, packed_linear's scale argument, the float32 weight it stands for)."""
    if not int8:
        return kernels.pack_weight(weight), {}, weight.float()
    q, scale = quantize_int8(weight)
    return kernels.pack_weight(q), {"scale": scale}, dequantize_int8(q, scale)


@pytest.mark.skipif(not PACKED, reason="packed_linear needs a CPU with AVX-512 BF16 units")
@pytest.mark.parametrize("int8", [False, True], ids=["bf16", "int8"])
@pytest.mark.parametrize("rows", [1, 3, 4, 8, 9, 33, 130])
@pytest.mark.parametrize("in_features, out_features", [(576, 832), (1536, 576), (64, 32)])
def test_packed_linear_matches_a_float32_product(rows, in_features, out_features, int8):
    kernels = cpu_kernels()
    generator = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, in_features, generator=generator).to(torch.bfloat16)
    weight = torch.randn(out_features, in_features, generator=generator).to(torch.bfloat16)
    bias = torch.randn(out_features, generator=generator).to(torch.bfloat16)
    packed, scale, reference = packed_weight(kernels, weight, int8)
    expected = F.linear(x.float(), reference)
    for got, want in [
        (kernels.packed_linear(x, packed, bias, **scale), expected + bias.float()),
        (kernels.packed_linear(x, packed, **scale), expected),
    ]:
        assert got.dtype == torch.bfloat16 and got.shape == (rows, out_features)
        # float32 sums rounded once to bf16: within bf16's half-ulp of each result
        torch.testing.assert_close(got.float(), want.to(torch.bfloat16).float(), atol=1e-3, rtol=8e-3)


@pytest.mark.skipif(not PACKED, reason="packed_linear needs a CPU with AVX-512 BF16 units")
@pytest.mark.parametrize("int8", [False, True], ids=["bf16", "int8"])
# On AMX tiles and, not a multiple of 32, on vectors; 52: an odd number of the loop's two-pair steps
@pytest.mark.parametrize("in_features", [576, 48, 52])
def test_a_packed_products_row_has_the_same_bits_whatever_rows_share_the_call(in_features, int8):
    """Steps of any batch, prefill chunks cut anywhere and drafted steps rely on it for replies that do not
    depend on what shares their steps.  int8 weights are widened in registers for up to 8 rows and into a
    buffer for more, and their two chains of sums run side by side for up to 4 rows, one after the other
    for more: the same values either way."""
    kernels = cpu_kernels()
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(300, in_features, generator=generator).to(torch.bfloat16)
    # 256 columns: a sum in another order rounds to other bf16 bits in only about 1 of 10,000 results
    weight = torch.randn(256, in_features, generator=generator).to(torch.bfloat16)
    packed, scale, _ = packed_weight(kernels, weight, int8)
    alone = torch.cat([kernels.packed_linear(x[row : row + 1], packed, **scale) for row in range(len(x))])
    for rows in 2, 4, 5, 8, 17, 32, 33, 70, 130, 300:
        assert torch.equal(kernels.packed_linear(x[:rows], packed, **scale), alone[:rows])


@pytest.mark.skipif(not PACKED, reason="packed_linear needs a CPU with AVX-512 BF16 units")
@pytest.mark.parametrize("rows", [8, 512], ids=["in-registers", "through-the-buffer"])
def test_every_packed_int8_value_widens_exactly(rows):
    """One-hot rows of x pick single weights out, so each output is one int8 value times its scale.  A
    weight's place in the 64-value groups the widening reads is its column mod 16 and its input mod 4;
    here each of those 64 places holds every value from -127 to 127 (inputs in steps of 4 walk them)."""
    columns, inputs = torch.arange(32)[:, None], torch.arange(512)[None, :]
    weight = (((columns // 16) * 128 + inputs // 4) % 255 - 127).to(torch.int8)
    packed, scale = cpu_kernels().pack_weight(weight), torch.ones(32)
    one_hot = torch.eye(512, dtype=torch.bfloat16)
    got = torch.cat([cpu_kernels().packed_linear(x, packed, None, scale) for x in one_hot.split(rows)])
    assert torch.equal(got.float(), weight.T.float())


@pytest.mark.skipif(not PACKED, reason="packed_linear needs a CPU with AVX-512 BF16 units")
def test_packed_int8_weights_need_their_scale_and_only_they_take_one():
    kernels = cpu_kernels()
    x = torch.ones(2, 64, dtype=torch.bfloat16)
    weight = torch.ones(32, 64, dtype=torch.bfloat16)
    packed, scale, _ = packed_weight(kernels, weight, int8=True)
    with pytest.raises(RuntimeError, match="scale"):
        kernels.packed_linear(x, packed)
    with pytest.raises(RuntimeError, match="scale"):
        kernels.packed_linear(x, kernels.pack_weight(weight), **scale)
    with pytest.raises(RuntimeError, match="one scale per output channel"):
        kernels.packed_linear(x, packed, scale=scale["scale"][:16])


def test_packing_refuses_shapes_it_cannot_hold():
    kernels = cpu_kernels()
    with pytest.raises(RuntimeError, match="multiple of 32"):
        kernels.pack_weight(torch.zeros(48, 64, dtype=torch.bfloat16))
    with pytest.raises(RuntimeError, match="multiple of 4"):
        kernels.pack_weight(torch.zeros(32, 66, dtype=torch.bfloat16))


def test_packing_refuses_int8_weights_that_sign_and_magnitude_cannot_hold():
    """-128 has no 7-bit magnitude; quantize_int8 never makes it."""
    weight = torch.zeros(32, 64, dtype=torch.int8)
    weight[3, 5] = -128
    with pytest.raises(RuntimeError, match=r"\[-127, 127\]"):
        cpu_kernels().pack_weight(weight)


@pytest.mark.skipif(not PACKED, reason="packed_linear needs a CPU with AVX-512 BF16 units")
def test_where_the_packed_copy_serves_every_product_the_plain_weight_is_released(smollm2_dir):
    llm = LLM(str(smollm2_dir), dtype="bfloat16", num_kv_blocks=64)
    model = llm.engine.runner.model
    linears = [m for m in model.modules() if isinstance(m, Linear)]
    assert all(m.weight.is_meta and m.max_kernel_rows == sys.maxsize for m in linears)
    checkpoint_values = 0
    for file in weight_files(smollm2_dir):
        with safe_open(file, framework="pt") as tensors:
            shapes = [tensors.get_slice(name).get_shape() for name in tensors.keys()]  # noqa: SIM118
            checkpoint_values += sum(math.prod(shape) for shape in shapes)
    # The weights once, and a packed copy of the embeddings for the tied lm_head (28 MB of 269).
    assert llm.engine.stats().weight_bytes < 1.25 * 2 * checkpoint_values
    reply = llm.generate(["The capital of France is"], SamplingParams(temperature=0, max_tokens=4))
    assert "Paris" in reply[0].outputs[0].text
    with pytest.raises(RuntimeError, match="released"):
        model.lm_head.use_kernels(None, torch.bfloat16)


@pytest.fixture(scope="module")
def one_call_model_dirs(smollm2_dir, tiny_model_dirs, tmp_path_factory):
    """Models whose decode steps take the one-call path: head_dim a multiple of 32 (the tiny Llama and
    Qwen2 have 16).  This Qwen2 brings q/k/v biases, the tiny Qwen3 its per-head norms."""

    def qwen2_with_two_heads(vocab):
        config = TINY_CONFIGS["qwen2"](vocab)
        config.num_attention_heads, config.num_key_value_heads = 2, 1
        return config

    qwen2 = build_model(qwen2_with_two_heads, smollm2_dir, tmp_path_factory.mktemp("qwen2-head-dim-32"))
    return {"smollm2": smollm2_dir, "qwen2": qwen2, "qwen3": tiny_model_dirs["qwen3"]}


@pytest.mark.parametrize("variant", NUMERIC_VARIANTS.values(), ids=NUMERIC_VARIANTS.keys())
@pytest.mark.parametrize("name", ["smollm2", "qwen2", "qwen3"])
def test_a_decode_step_in_one_call_computes_what_the_layers_compute(name, variant, one_call_model_dirs):
    check_one_call_against_layers(one_call_model_dirs[name], "float32", variant)


@pytest.mark.skipif(not PACKED, reason="packed_linear needs a CPU with AVX-512 BF16 units")
def test_a_bf16_decode_step_in_one_call_computes_what_the_layers_compute(one_call_model_dirs):
    """Both paths take the packed weights."""
    check_one_call_against_layers(one_call_model_dirs["smollm2"], "bfloat16", {})


def check_one_call_against_layers(model_dir, dtype: str, variant: dict) -> None:
    config = EngineConfig(model=model_dir, dtype=dtype, num_kv_blocks=64, **variant)
    engine = LLMEngine(config)
    runner, model = engine.runner, engine.runner.model
    assert model.decode_layers is not None
    forward, compared = model.forward, []

    def both_paths(input_ids, positions, kv_cache, kv_scales, meta):
        if meta.prefills:
            return forward(input_ids, positions, kv_cache, kv_scales, meta)
        importance_before = runner.kv_cache.importance.clone()
        hidden = forward(input_ids, positions, kv_cache, kv_scales, meta)
        one_call_importance = runner.kv_cache.importance.clone()
        runner.kv_cache.importance.copy_(importance_before)
        one_call, model.decode_layers = model.decode_layers, None
        expected = forward(input_ids, positions, kv_cache, kv_scales, meta)  # layer by layer, the same KV
        model.decode_layers = one_call
        assert torch.equal(hidden, expected)
        torch.testing.assert_close(one_call_importance, runner.kv_cache.importance)
        compared.append((len(input_ids), meta.importance is not None))
        return hidden

    model.forward = both_paths
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    # Alone and without a session (no importance), then three at once, two of them sessions, then
    # seventeen (past the kernel's rows where the CPU has bf16 units, int8 too: torch's products inside
    # the one call).
    many = [(f"n{i}", f"session n{i}" if i % 2 else None) for i in range(17)]
    for requests in [[("alone", None)], [("a", None), ("b", "session b"), ("c", "session c")], many]:
        for i, (request_id, session_id) in enumerate(requests):
            prompt = {"prompt_token_ids": [5 + i] * (20 + 3 * i)}
            engine.add_request(request_id, prompt, params, session_id=session_id)
        while engine.has_unfinished_requests():
            engine.step()
    assert (1, False) in compared and (3, True) in compared and (17, True) in compared
