"""Weight-only int8: the quantization round trip, every product path against a float reference computed
from the dequantized weights, and the engine's option checks.  The int8 KV cache: its sizes, what the
engine reports, and slots read and written in their stored form (its attention kernels are tested in
test_cpu_kernels.py, its outputs in test_greedy_equals_transformers.py)."""

import pytest
import torch
import torch.nn.functional as F

from engine import LLM, SamplingParams
from engine.config import EngineConfig
from engine.kernels import cpu_kernels
from engine.kv_cache import KvCache
from engine.llm_engine import LLMEngine, model_fingerprint
from engine.quantization import dequantize_int8, int8_linear, quantize_int8


def test_quantizing_rounds_each_weight_to_the_nearest_step_of_its_row():
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(64, 300, generator=generator) * torch.logspace(-3, 1, 64)[:, None]
    weight[5] = 0
    q, scale = quantize_int8(weight)
    assert q.dtype == torch.int8 and scale.dtype == torch.float32 and scale.shape == (64,)
    assert q.abs().max() == 127 and scale[5] == 1 and (q[5] == 0).all()
    error = (dequantize_int8(q, scale) - weight).abs()
    assert (error <= scale[:, None] / 2 * (1 + 1e-6)).all()
    assert (q.abs().amax(dim=1)[torch.arange(64) != 5] == 127).all()  # every row uses its whole range


def products(kernels):
    """Each way a quantized layer can compute: our kernel (decode steps) and torch's product (the rest)."""
    paths = [("torch", lambda x, q, scale, bias: int8_linear(x, q, scale, bias))]
    if kernels is not None:
        paths.append(("kernel", lambda x, q, scale, bias: kernels.few_rows_linear(x, q, bias, scale)))
    return paths


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 11, 64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_int8_products_match_the_dequantized_weights(rows, dtype):
    generator = torch.Generator().manual_seed(rows)
    for in_features, out_features in [(576, 960), (100, 37), (120, 5)]:  # the tails past whole vectors
        x = torch.randn(rows, in_features, generator=generator).to(dtype)
        q, scale = quantize_int8(torch.randn(out_features, in_features, generator=generator))
        bias = torch.randn(out_features, generator=generator).to(dtype)
        weight = dequantize_int8(q, scale)
        tolerance = 1e-4 if dtype == torch.float32 else 2e-2
        for name, product in products(cpu_kernels()):
            for with_bias in (bias, None):
                got = product(x, q, scale, with_bias)
                want = F.linear(x.float(), weight, None if with_bias is None else with_bias.float())
                assert got.dtype == dtype and got.shape == (rows, out_features), name
                torch.testing.assert_close(
                    got.float(), want, atol=tolerance * in_features**0.5, rtol=tolerance, msg=name
                )


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_int8_products_of_16_bit_x_round_only_as_the_kernels_int16_blocks_say(dtype):
    """Where the CPU has AVX2 and not AVX-512, the few-row kernel holds 16-bit x in int16 with a power-of-two
    scale per block of 256 values: a value 2^8 (bf16; float16: 2^5) times smaller than its block's largest
    rounds by at most 2^-16 of that largest, the rest are exact.  With outliers 2^10 times the typical value
    in every block and values 2^-12 of it, the products stay within that bound, float32 accumulation and
    their output's rounding (8-bit x, say, would not).  Elsewhere the float path, which rounds less, passes
    it too."""
    kernels = cpu_kernels()
    if kernels is None:
        pytest.skip("no C++ compiler")
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(5, 1100, generator=generator)
    x[:, ::97] *= 2.0**10
    x[:, 1::5] *= 2.0**-12
    x = x.to(dtype)
    q, scale = quantize_int8(torch.randn(300, 1100, generator=generator))
    weight = dequantize_int8(q, scale).double()
    want = F.linear(x.double(), weight)
    got = kernels.few_rows_linear(x, q, None, scale).double()
    block_largest = F.pad(x.double().abs(), (0, 1280 - 1100)).view(5, 5, 256).amax(dim=2)
    weight_sums = F.pad(weight.abs(), (0, 1280 - 1100)).view(300, 5, 256).sum(dim=2)
    x_rounding = block_largest @ weight_sums.T * 2.0**-16
    accumulation = x.double().abs() @ weight.abs().T * 2.0**-20
    ulp = 2.0 ** torch.floor(torch.log2(torch.maximum(want.abs(), got.abs()))) * torch.finfo(dtype).eps
    assert ((got - want).abs() <= ulp / 2 + x_rounding + accumulation).all()


def test_the_kernel_refuses_int8_weights_without_their_scales():
    kernels = cpu_kernels()
    if kernels is None:
        pytest.skip("no C++ compiler")
    q, scale = quantize_int8(torch.randn(8, 32))
    with pytest.raises(RuntimeError, match="scale per output channel"):
        kernels.few_rows_linear(torch.randn(1, 32), q, None)
    with pytest.raises(RuntimeError, match="one scale per output channel"):
        kernels.few_rows_linear(torch.randn(1, 32), q, None, scale[:4])


def test_an_unknown_quantization_is_refused_by_name(smollm2_dir):
    with pytest.raises(ValueError, match=r"quantization must be one of \('int8',\), got 'int4'"):
        EngineConfig(model=smollm2_dir, quantization="int4")


def test_every_linear_layer_is_int8_and_the_tied_embeddings_stay_in_the_compute_dtype(smollm2_dir):
    llm = LLM(str(smollm2_dir), dtype="bfloat16", quantization="int8", num_kv_blocks=64)
    model = llm.engine.runner.model
    layer = model.layers[0]
    linears = [layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj]
    linears.append(model.lm_head)
    assert all(m.weight.dtype == torch.int8 and m.weight_scale.dtype == torch.float32 for m in linears)
    assert model.embed_tokens.weight.dtype == torch.bfloat16
    bf16 = LLM(str(smollm2_dir), dtype="bfloat16", num_kv_blocks=64)
    # Where the CPU runs packed products, both hold only the packed copy (layers/linear.py).
    assert llm.engine.stats().weight_bytes < 0.75 * bf16.engine.stats().weight_bytes
    question = [{"role": "user", "content": "What is the capital of France?"}]
    reply = llm.chat(question, SamplingParams(temperature=0, max_tokens=8))
    assert "Paris" in reply[0].outputs[0].text


def test_kv_saved_under_one_quantization_is_not_taken_for_another(smollm2_dir):
    fingerprints = {model_fingerprint(smollm2_dir, torch.bfloat16, q) for q in (None, "int8")}
    assert len(fingerprints) == 2


def test_an_unknown_kv_cache_dtype_is_refused_by_name(smollm2_dir):
    with pytest.raises(ValueError, match=r"kv_cache_dtype must be one of \('auto', 'int8'\), got 'fp8'"):
        EngineConfig(model=smollm2_dir, kv_cache_dtype="fp8")


def test_an_int8_kv_pool_holds_about_twice_the_tokens_of_a_bf16_one_and_says_so(smollm2_dir):
    stats = {}
    for kv_cache_dtype in "auto", "int8":
        config = EngineConfig(
            smollm2_dir, dtype="bfloat16", kv_cache_dtype=kv_cache_dtype, kv_cache_memory_gb=0.05
        )
        stats[kv_cache_dtype] = LLMEngine(config).stats()
    bf16, int8 = stats["auto"], stats["int8"]
    assert (bf16.dtype, bf16.kv_cache_dtype, int8.dtype, int8.kv_cache_dtype) == ("bfloat16",) * 3 + ("int8",)
    # SmolLM2: head_dim 64, so 64 bytes and a 4-byte scale per token, KV head and layer against 128 bytes.
    assert int8.kv_pool_tokens / bf16.kv_pool_tokens == pytest.approx(128 / 68, rel=0.01)
    assert int8.kv_pool_bytes <= 0.05 * 2**30 and int8.kv_pool_bytes / int8.kv_pool_tokens == 2 * 30 * 3 * 68


def test_slots_move_between_int8_pools_in_their_stored_form(smollm2_dir):
    llm = LLM(str(smollm2_dir), dtype="float32", kv_cache_dtype="int8", num_kv_blocks=16)
    llm.generate(
        ["The quick brown fox jumps over the lazy dog."], SamplingParams(temperature=0, max_tokens=4)
    )
    cache = llm.engine.runner.kv_cache
    assert cache.tensor.dtype == torch.int8 and cache.scales.abs().sum() > 0
    stored = cache.read_slots(cache.slot_ids([0], 10)).cpu()
    assert stored.keys.dtype == torch.int8 and stored.scales.shape == (30, 2, 10, 3)
    cache.write_slots(cache.slot_ids([5], 10), stored)
    moved = cache.read_slots(cache.slot_ids([5], 10))
    assert all(torch.equal(a, b) for a, b in [(moved.keys, stored.keys), (moved.scales, stored.scales)])
    float_pool = KvCache(llm.engine.runner.model.shape, 4, 16, torch.float32, "cpu")
    with pytest.raises(ValueError, match="cannot go into"):
        float_pool.write_slots(float_pool.slot_ids([0], 10), stored)
