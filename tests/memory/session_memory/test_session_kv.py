"""Session KV across turns: exact while within budget, restorable after a restart, and compressed with
attention-based eviction when over it; with the KV cache in the compute dtype and in int8, and with
speculative decoding."""

import pytest
import torch

from engine.session_kv import common_prefix
from engine.testing.oracle import DEVICE, first_divergence_is_a_near_tie, greedy_margins, reference_greedy
from memory.session_memory import kv_files
from tests.memory.session_memory.conftest import QUESTIONS, Conversation, memory_for

KV_DTYPES = ["auto", "int8"]
ENGINES = [("auto", None), ("int8", None), ("auto", "ngram")]  # (KV cache dtype, speculative)


def assert_equals_transformers(model, turn, max_tokens: int, kv_cache_dtype: str) -> None:
    """Token for token; with the int8 KV cache, up to a first divergence at a near tie."""
    expected = reference_greedy(model, turn.prompt_ids, max_tokens, kv_cache_dtype)
    if kv_cache_dtype == "auto":
        assert turn.reply_ids == expected
    else:
        margins = greedy_margins(model, turn.prompt_ids, expected, kv_cache_dtype)
        assert first_divergence_is_a_near_tie(turn.reply_ids, expected, margins)


@pytest.mark.parametrize("kv_cache_dtype, speculative", ENGINES)
@pytest.mark.parametrize("model", ["smollm2", "qwen3"])
def test_five_turns_equal_transformers_recomputing_and_prefill_only_new_tokens(
    hf_models, tmp_path, model, kv_cache_dtype, speculative
):
    dirs, models = hf_models
    memory = memory_for(dirs[model], tmp_path, kv_cache_dtype=kv_cache_dtype, speculative=speculative)
    chat = Conversation(memory, "five-turns")
    try:
        previous_text: list[int] = []
        for question in QUESTIONS:
            turn = chat.ask(question)
            assert_equals_transformers(models[model], turn, chat.max_tokens, kv_cache_dtype)
            reusable = min(common_prefix(previous_text, turn.prompt_ids), len(turn.prompt_ids) - 1)
            assert turn.cached == reusable and turn.prefilled == len(turn.prompt_ids) - reusable
            session = memory.cache.sessions["five-turns"]
            previous_text = session.text_token_ids
        later = chat.turns[1:]
        assert all(
            turn.cached >= len(earlier.prompt_ids) for earlier, turn in zip(chat.turns, later, strict=False)
        )
        assert (memory.stats().spec_accepted_tokens > 0) == (speculative is not None)
    finally:
        memory.shutdown()


@pytest.fixture(scope="module")
def never_restarted(smollm2_dir, tmp_path_factory):
    """Per KV cache dtype, the third turn of a conversation that never restarted."""
    turns = {}

    def third_turn(kv_cache_dtype="auto"):
        if kv_cache_dtype not in turns:
            memory = memory_for(
                smollm2_dir, tmp_path_factory.mktemp("reference"), kv_cache_dtype=kv_cache_dtype
            )
            chat = Conversation(memory, "restart")
            try:
                for question in QUESTIONS[:3]:
                    chat.ask(question)
                turns[kv_cache_dtype] = chat.turns[-1]
            finally:
                memory.shutdown()
        return turns[kv_cache_dtype]

    return third_turn


@pytest.fixture
def expected(never_restarted):
    return never_restarted()


def two_turns_then_stop(smollm2_dir, data_dir, kv_cache_dtype="auto") -> Conversation:
    memory = memory_for(smollm2_dir, data_dir, kv_cache_dtype=kv_cache_dtype)
    chat = Conversation(memory, "restart")
    for question in QUESTIONS[:2]:
        chat.ask(question)
    memory.shutdown()  # saves every session still in the pool
    return chat


def continue_after_restart(smollm2_dir, data_dir, chat: Conversation, kv_cache_dtype="auto"):
    chat.memory = memory_for(smollm2_dir, data_dir, kv_cache_dtype=kv_cache_dtype)
    try:
        turn = chat.ask(QUESTIONS[2])
        return turn, chat.memory.warnings.get("restart")
    finally:
        chat.memory.shutdown()


@pytest.mark.parametrize("kv_cache_dtype", KV_DTYPES)
def test_a_restarted_server_resumes_from_disk_with_the_same_reply(
    smollm2_dir, tmp_path, never_restarted, kv_cache_dtype
):
    expected = never_restarted(kv_cache_dtype)
    chat = two_turns_then_stop(smollm2_dir, tmp_path / "data", kv_cache_dtype)
    turn, warning = continue_after_restart(smollm2_dir, tmp_path / "data", chat, kv_cache_dtype)
    assert warning is None
    assert turn.reply_ids == expected.reply_ids
    assert turn.prefilled == expected.prefilled < len(turn.prompt_ids) // 2  # no full prefill


@pytest.mark.parametrize("saved, resumed", [("int8", "auto"), ("auto", "int8")])
def test_kv_saved_in_one_kv_dtype_is_recomputed_in_another(smollm2_dir, hf_models, tmp_path, saved, resumed):
    chat = two_turns_then_stop(smollm2_dir, tmp_path / "data", saved)
    path = kv_files.session_file(tmp_path / "data" / "sessions", "restart")
    assert kv_files.load(path, chat.memory.fingerprint, chat.memory.dtype).kv.keys.dtype == chat.memory.dtype
    turn, warning = continue_after_restart(smollm2_dir, tmp_path / "data", chat, resumed)
    assert warning is not None and "recomputing" in warning
    assert turn.prefilled == len(turn.prompt_ids)  # the whole history, recomputed
    assert_equals_transformers(hf_models[1]["smollm2"], turn, chat.max_tokens, resumed)


@pytest.mark.parametrize("damage", ["flip", "truncate", "foreign"])
def test_a_damaged_kv_file_falls_back_to_recomputing_with_a_warning(smollm2_dir, tmp_path, damage, expected):
    chat = two_turns_then_stop(smollm2_dir, tmp_path / "data")
    path = kv_files.session_file(tmp_path / "data" / "sessions", "restart")
    data = bytearray(path.read_bytes())
    if damage == "flip":
        data[-100] ^= 0xFF
        path.write_bytes(bytes(data))
    elif damage == "truncate":
        path.write_bytes(bytes(data[: len(data) // 2]))
    else:
        snapshot = kv_files.load(path, chat.memory.fingerprint, torch.float32)
        kv_files.save(snapshot, path, fingerprint="another-model")
    turn, warning = continue_after_restart(smollm2_dir, tmp_path / "data", chat)
    assert warning is not None and "recomputing" in warning
    assert turn.reply_ids == expected.reply_ids
    assert turn.prefilled == len(turn.prompt_ids)  # the whole history, recomputed


@pytest.mark.parametrize("kv_cache_dtype, speculative", ENGINES)
def test_over_budget_sessions_keep_sinks_recent_and_heavy_hitters(
    smollm2_dir, tmp_path, kv_cache_dtype, speculative
):
    budget, recent = 96, 32
    memory = memory_for(
        smollm2_dir,
        tmp_path,
        kv_cache_dtype=kv_cache_dtype,
        speculative=speculative,
        session_budget_tokens=budget,
        recent_tokens=recent,
    )
    chat = Conversation(memory, "small", max_tokens=24)
    try:
        for question in QUESTIONS:
            turn = chat.ask(question)
            assert turn.reply.strip()
            session = memory.cache.sessions["small"]
            assert session.num_slots <= budget
        text_length = len(session.text_token_ids)
        assert session.evicted_tokens == text_length - session.num_slots > 0
        assert session.positions[:4] == [0, 1, 2, 3]
        assert session.positions[-recent:] == list(range(text_length - recent, text_length))
        assert session.evictions and all(r.tokens_after <= budget for r in session.evictions)
    finally:
        memory.shutdown()


def masked_greedy(
    model, prompt_ids: list[int], evicted: set[int], reused_until: int, steps: int
) -> list[int]:
    """The oracle for evicted KV: transformers over the whole text with the original positions, where
    tokens from `reused_until` on cannot see the evicted positions (earlier tokens saw everything)."""
    ids = list(prompt_ids)
    for _ in range(steps):
        length = len(ids)
        visible = torch.ones(length, length, dtype=torch.bool, device=DEVICE).tril()
        hidden = torch.tensor(sorted(evicted), dtype=torch.long, device=DEVICE)
        visible[reused_until:, hidden] = False
        logits = model(
            torch.tensor([ids], device=DEVICE),
            attention_mask=visible[None, None],
            position_ids=torch.arange(length, device=DEVICE)[None],
        ).logits
        ids.append(int(logits[0, -1].argmax()))
    return ids[len(prompt_ids) :]


@pytest.mark.parametrize("model, speculative", [("qwen3", None), ("smollm2", None), ("smollm2", "ngram")])
def test_evicted_kv_keeps_original_positions_as_transformers_with_those_tokens_masked(
    hf_models, tmp_path, model, speculative
):
    dirs, models = hf_models
    memory = memory_for(dirs[model], tmp_path, speculative=speculative)
    chat = Conversation(memory, "rope", max_tokens=10)
    try:
        for question in QUESTIONS[:2]:
            chat.ask(question)
        session = memory.cache.sessions["rope"]
        evicted = set(range(12, 40))
        keep = [slot for slot, position in enumerate(session.positions) if position not in evicted]
        memory.engine.call_sync(lambda: memory.cache.compress("rope", keep))
        turn = chat.ask(QUESTIONS[2])
        reused_until = turn.cached  # the text position where this turn's computed tokens begin
        assert reused_until > 40
        assert turn.reply_ids == masked_greedy(models[model], turn.prompt_ids, evicted, reused_until, 10)
    finally:
        memory.shutdown()


def test_speculation_counts_only_accepted_positions_in_the_attention_importance(smollm2_dir, tmp_path):
    """Rejected drafts' queries must not add to what eviction keeps tokens by: the importance a session
    holds after two turns is the same with speculation as without (up to the kernels' rounding)."""
    held = {}
    for speculative in None, "ngram":
        memory = memory_for(smollm2_dir, tmp_path / str(speculative), speculative=speculative)
        chat = Conversation(memory, "importance", max_tokens=24)
        try:
            for question in QUESTIONS[:2]:
                chat.ask(question)
            held[speculative] = memory.engine.call_sync(lambda m=memory: m.cache.importance("importance"))
            stats = memory.stats()
        finally:
            memory.shutdown()
    assert 0 < stats.spec_accepted_tokens < stats.spec_draft_tokens  # some drafts were rejected
    torch.testing.assert_close(held["ngram"], held[None], rtol=1e-3, atol=1e-3)
