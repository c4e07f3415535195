"""Session KV and a full pool: waiting turns hold no blocks, so they cannot starve each other."""

from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)


def run(engine: LLMEngine, max_steps: int = 500) -> dict[str, list[int]]:
    tokens: dict[str, list[int]] = {}
    for _ in range(max_steps):
        if not engine.has_unfinished_requests():
            return tokens
        for update in engine.step():
            tokens.setdefault(update.seq.request_id, []).extend(update.new_token_ids)
    raise AssertionError(f"still unfinished after {max_steps} steps: the scheduler is stuck")


def test_second_turns_of_sessions_that_fill_the_pool_all_finish(tiny_model_dirs):
    engine = LLMEngine(EngineConfig(model=tiny_model_dirs["llama"], dtype="float32", num_kv_blocks=8))
    first = {name: [7 + i for i in range(40)] for name in ("a", "b")}  # 40 + 20 tokens: 4 blocks each
    for name, prompt in first.items():
        engine.add_request(f"{name}1", {"prompt_token_ids": prompt}, GREEDY, session_id=name)
    replies = run(engine)
    assert engine.block_manager.num_free_blocks == 0  # both sessions hold their KV: the pool is full
    for name, prompt in first.items():
        follow_up = prompt + replies[f"{name}1"] + [9] * 10  # needs 6 blocks
        engine.add_request(f"{name}2", {"prompt_token_ids": follow_up}, GREEDY, session_id=name)
    replies = run(engine)
    assert len(replies["a2"]) == len(replies["b2"]) == 20
