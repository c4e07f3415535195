"""Threads that run torch beside the engine: passing threads end, and every thread of ours sets its own
torch thread count whatever a helper did before it (engine/threads.py)."""

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from engine.async_engine import AsyncEngine
from engine.config import EngineConfig
from engine.threads import DEFAULT_THREADS, run_in_passing_thread, single_threaded_torch, use_default_threads


@pytest.fixture
def single_threaded_helper():
    """A live helper thread that went single-threaded first, as the query encoder does."""
    helper = ThreadPoolExecutor(1, initializer=single_threaded_torch)
    assert helper.submit(torch.get_num_threads).result() == 1
    yield helper
    helper.shutdown()
    use_default_threads()  # torch's default for threads started later, as it was


def test_a_passing_thread_returns_raises_and_ends():
    before = set(threading.enumerate())
    assert run_in_passing_thread(lambda a, b: a + b, 2, 3) == 5
    with pytest.raises(ValueError, match="bad"):
        run_in_passing_thread(lambda: (_ for _ in ()).throw(ValueError("bad")))
    assert set(threading.enumerate()) <= before


def test_the_engine_keeps_all_threads_after_a_helper_went_single_threaded(
    single_threaded_helper, tiny_model_dirs
):
    engine = AsyncEngine(EngineConfig(model=tiny_model_dirs["llama"], dtype="float32", num_kv_blocks=16))
    try:
        assert engine.call_sync(torch.get_num_threads) == DEFAULT_THREADS
    finally:
        engine.shutdown()


def test_a_passing_thread_keeps_all_threads_after_a_helper_went_single_threaded(single_threaded_helper):
    assert run_in_passing_thread(torch.get_num_threads) == DEFAULT_THREADS
