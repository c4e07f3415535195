"""Where every product of a bf16 model runs on our packed kernels (a CPU with AVX-512 BF16 or AMX units;
int8 weights on AVX-512 BF16 without AMX), each row's sums depend on that row alone, so a request's logits
have the same bits whatever shares its steps: other requests, prefill chunks cut elsewhere, speculative
drafts.  Greedy replies then do not depend on load.  (Elsewhere bf16 products round differently by batch
size, as torch's and vLLM's do.)"""

import sys

import pytest
import torch

from engine import SamplingParams
from engine.config import EngineConfig, cpu_has_amx
from engine.kernels import cpu_kernels
from engine.layers.linear import Linear
from engine.llm_engine import LLMEngine
from engine.testing.recording import record_logits, run_to_end

pytestmark = pytest.mark.skipif(
    cpu_kernels() is None or not cpu_kernels().packed_linear_available(),
    reason="row-independent bf16 products need a CPU with AVX-512 BF16 units",
)

PROMPTS = [
    "Summarise the delivery terms: parcels ship within two days and arrive within a week. " * 3,
    "List three ways to keep a kettle free of limescale.",
    "请用两句话介绍一下长城的历史。",
]


def bf16_engine(model_dir, **options) -> LLMEngine:
    engine = LLMEngine(EngineConfig(model=str(model_dir), dtype="bfloat16", num_kv_blocks=128, **options))
    linears = [m for m in engine.runner.model.modules() if isinstance(m, Linear)]
    assert all(m.max_kernel_rows == sys.maxsize for m in linears)
    return engine


def run(engine: LLMEngine, prompts: dict[str, str], max_tokens: int) -> dict[str, list[int]]:
    return run_to_end(engine, prompts, SamplingParams(temperature=0, max_tokens=max_tokens))[0]


def of_request(recorded: dict[tuple[str, int], torch.Tensor], request_id: str) -> dict[int, torch.Tensor]:
    return {position: logits for (owner, position), logits in recorded.items() if owner == request_id}


INT8_PACKED = pytest.param(
    4, "int8", marks=pytest.mark.skipif(cpu_has_amx(), reason="int8 products are packed only without AMX")
)


# 4 and 22 repeats: about 60 and 570 prompt tokens
@pytest.mark.parametrize("repeats, quantization", [(4, None), (22, None), INT8_PACKED])
def test_a_requests_logits_keep_their_bits_beside_others_and_in_other_chunks(
    smollm2_dir, repeats, quantization
):
    prompt = "Tell me about the order A-7731-Q for the Nordic Steel Kettle, shipped on Monday. " * repeats
    alone_engine = bf16_engine(smollm2_dir, quantization=quantization)
    alone = record_logits(alone_engine)
    reply = run(alone_engine, {"r": prompt}, 16)["r"]

    # A 40-token budget cuts r's prefill into chunks that share steps with the others' decodes.
    busy_engine = bf16_engine(smollm2_dir, quantization=quantization, max_num_batched_tokens=40)
    busy = record_logits(busy_engine)
    others = {f"other-{i}": text for i, text in enumerate(PROMPTS)}
    replies = run(busy_engine, {**others, "r": prompt}, 16)

    assert replies["r"] == reply
    alone, busy = of_request(alone, "r"), of_request(busy, "r")
    assert busy.keys() == alone.keys() and len(alone) == 16
    assert all(torch.equal(busy[position], alone[position]) for position in alone)


def test_greedy_replies_keep_their_bits_with_speculation_under_load(smollm2_dir):
    requests = {f"r-{i}": text for i, text in enumerate(PROMPTS)}
    off = run(bf16_engine(smollm2_dir), requests, 32)
    engine = bf16_engine(smollm2_dir, speculative="ngram", max_num_batched_tokens=40)
    assert run(engine, requests, 32) == off
    assert engine.stats().spec_accepted_tokens > 0
