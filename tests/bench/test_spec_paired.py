from bench.spec_paired import paired_round, summarize
from bench.spec_workloads import Request
from engine.config import EngineConfig
from engine.llm_engine import LLMEngine


def test_both_engines_decode_every_request_and_agree(tiny_model_dirs):
    model = str(tiny_model_dirs["llama"])
    engines = {
        "off": LLMEngine(EngineConfig(model=model, dtype="float32", num_kv_blocks=64)),
        "ngram": LLMEngine(EngineConfig(model=model, dtype="float32", num_kv_blocks=64, speculative="ngram")),
    }
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
