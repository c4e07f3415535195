from bench.paired import PAIRS, chat_requests, paired_round, summarize
from bench.spec_workloads import Request
from engine.config import EngineConfig
from engine.llm_engine import LLMEngine


def engines_of(pair: str, model: str) -> dict[str, LLMEngine]:
    return {
        name: LLMEngine(EngineConfig(model=model, dtype="float32", num_kv_blocks=64, **options))
        for name, options in PAIRS[pair].variants.items()
    }


def test_both_engines_decode_every_request_and_agree(tiny_model_dirs):
    engines = engines_of("speculative", str(tiny_model_dirs["llama"]))
    pattern = list(range(300, 320))
    requests = [Request(pattern * 4, 24, ignore_eos=True), Request(pattern[::-1] * 3, 16, ignore_eos=True)]
    rounds = [paired_round(engines, requests, round_index) for round_index in range(2)]
    for decoded in rounds:
        assert decoded["off"]["replies"] == decoded["ngram"]["replies"]
        assert [len(reply) for reply in decoded["off"]["replies"]] == [24, 16]
        assert decoded["off"]["tokens"] == decoded["ngram"]["tokens"] == 23 + 15
        assert decoded["off"]["seconds"] > 0 and decoded["ngram"]["seconds"] > 0
    figures = summarize(rounds)
    assert figures["equal_replies"] == [4, 4] and len(figures["speedup"]["rounds"]) == 2


def test_the_int8_pair_runs_the_batch_one_chat_on_both_weight_formats(tiny_model_dirs):
    engines = engines_of("int8", str(tiny_model_dirs["llama"]))
    assert engines["int8"].config.quantization == "int8" and engines["bf16"].config.quantization is None
    requests = chat_requests("chat", engines["bf16"].tokenizer, 2, 1000)
    assert [len(r.prompt_token_ids) >= 100 and r.max_tokens == 128 and r.ignore_eos for r in requests] == [
        True
    ] * 2
    figures = summarize([paired_round(engines, requests, 0)])
    assert set(figures) == {"bf16_tokens_per_s", "int8_tokens_per_s", "speedup", "equal_replies"}
    assert figures["equal_replies"][1] == 2 and figures["speedup"]["median"] > 0
