"""The C++ decode kernel and the portable torch path agree, and both match plain attention."""

import pytest
import torch
import torch.nn.functional as F

from engine import LLM, SamplingParams
from engine.kernels import cpu_kernels
from engine.layers.attention import (
    AttentionMetadata,
    kernel_decode_attention,
    split_layer_cache,
    torch_decode_attention,
)

BLOCK = 16


def random_case(seqs, heads, kv_heads, head_dim, max_len, dtype, seed=0):
    generator = torch.Generator().manual_seed(seed)
    num_blocks = seqs * (max_len // BLOCK + 1) + 3
    layer_cache = torch.randn(2, num_blocks, kv_heads, BLOCK * head_dim, generator=generator).to(dtype)
    lens = torch.randint(1, max_len + 1, (seqs,), generator=generator)
    width = int((lens.max() + BLOCK - 1) // BLOCK)
    tables = torch.randperm(num_blocks, generator=generator)[: seqs * width].view(seqs, width)
    q = torch.randn(seqs, heads, head_dim, generator=generator).to(dtype)
    meta = AttentionMetadata(torch.empty(0), torch.empty(0), seqs, tables, lens)
    return q, layer_cache, meta


def plain_attention(q, layer_cache, meta):
    """Attention for each sequence alone, reading its tokens one by one from the blocks."""
    keys, values = split_layer_cache(layer_cache, q.shape[-1])
    outputs = []
    for row, length in enumerate(meta.decode_context_lens.tolist()):
        slots = [(meta.decode_block_tables[row, t // BLOCK], t % BLOCK) for t in range(length)]
        k = torch.stack([keys[b, :, :, o] for b, o in slots], dim=1)  # (kv_heads, tokens, head_dim)
        v = torch.stack([values[b, :, o, :] for b, o in slots], dim=1)
        query = q[row].unsqueeze(1).float()  # (heads, 1, head_dim)
        out = F.scaled_dot_product_attention(query[None], k.float()[None], v.float()[None], enable_gqa=True)
        outputs.append(out[0, :, 0])
    return torch.stack(outputs)


@pytest.mark.parametrize("heads, kv_heads, head_dim", [(9, 3, 64), (4, 2, 32), (8, 1, 128), (4, 4, 64)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_paths_match_plain_attention(heads, kv_heads, head_dim, dtype):
    kernels = cpu_kernels()
    assert kernels is not None, "the C++ kernels did not build"
    q, layer_cache, meta = random_case(5, heads, kv_heads, head_dim, max_len=70, dtype=dtype)
    keys, values = split_layer_cache(layer_cache, head_dim)
    expected = plain_attention(q, layer_cache, meta)
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    via_kernel = kernel_decode_attention(q, keys, values, meta, kernels)
    via_torch = torch_decode_attention(q, keys, values, meta)
    torch.testing.assert_close(via_kernel.float(), expected, atol=tolerance, rtol=tolerance)
    torch.testing.assert_close(via_torch.float(), expected, atol=tolerance, rtol=tolerance)


def test_the_engine_uses_the_kernels_and_the_torch_path_gives_the_same_tokens(smollm2_dir, oracle):
    prompts, expected = oracle("smollm2", 24)
    llm = LLM(str(smollm2_dir), dtype="float32", num_kv_blocks=512)
    assert llm.engine.runner.model.kernels is not None
    llm.engine.runner.model.kernels = None  # what a CUDA device (or a machine without a compiler) runs
    outputs = llm.generate(prompts[:3], SamplingParams(temperature=0, max_tokens=24))
    assert [o.outputs[0].token_ids for o in outputs] == expected[:3]
