"""Exact block ids, reference counts, LRU eviction order and hash checks of the block pool."""

from engine.block_manager import BlockManager
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence

BS = 4


def make_seq(tokens: list[int], request_id: str = "r") -> Sequence:
    return Sequence(request_id, tokens, SamplingParams(max_tokens=4))


def start(manager: BlockManager, seq: Sequence) -> Sequence:
    """What the scheduler does: take the cached prefix, allocate the rest, compute it all."""
    manager.take_cached_prefix(seq)
    assert manager.allocate_slots(seq, seq.num_uncomputed_tokens)
    manager.record_prefix_lookup(seq)
    seq.num_computed_tokens = seq.num_tokens
    manager.cache_full_blocks(seq)
    return seq


def test_allocation_takes_free_blocks_in_order_and_counts_refs():
    manager = BlockManager(num_blocks=8, block_size=BS)
    seq = start(manager, make_seq(list(range(10))))
    assert seq.block_table == [0, 1, 2]
    assert [manager.blocks[i].ref_count for i in range(4)] == [1, 1, 1, 0]
    assert manager.num_free_blocks == 5
    manager.free(seq)
    assert manager.num_free_blocks == 8 and all(block.ref_count == 0 for block in manager.blocks)


def test_full_blocks_are_shared_and_the_last_token_is_recomputed():
    manager = BlockManager(num_blocks=8, block_size=BS)
    first = start(manager, make_seq(list(range(8)), "a"))  # two full blocks
    second = make_seq(list(range(8)), "b")
    manager.take_cached_prefix(second)
    # The identical prompt may reuse only the first block: its last token must be recomputed.
    assert second.block_table == first.block_table[:1]
    assert second.num_computed_tokens == BS
    assert manager.blocks[first.block_table[0]].ref_count == 2
    third = make_seq(list(range(9)), "c")
    manager.take_cached_prefix(third)
    assert third.block_table == first.block_table and third.num_computed_tokens == 2 * BS


def test_hit_counters_count_prompt_tokens():
    manager = BlockManager(num_blocks=8, block_size=BS)
    start(manager, make_seq(list(range(9)), "a"))
    start(manager, make_seq(list(range(9)), "b"))
    assert manager.prefix_queries == 18
    assert manager.prefix_hits == 8


def test_freed_blocks_stay_cached_until_reallocated_in_lru_order_tails_first():
    manager = BlockManager(num_blocks=4, block_size=BS)
    seq = start(manager, make_seq(list(range(9))))  # blocks 0, 1 full and hashed; 2 partial
    manager.free(seq)
    # Freed tail first: the free queue is 3 (never used), then 2, 1, 0.
    assert list(manager.free_queue) == [3, 2, 1, 0]
    again = make_seq(list(range(9)))
    manager.take_cached_prefix(again)
    assert again.block_table == [0, 1]  # still cached after being freed
    manager.free(again)
    other = start(manager, make_seq([100 + i for i in range(9)]))  # needs 3 blocks: evicts 3, 2, 1
    assert other.block_table == [3, 2, 1]
    probe = make_seq(list(range(9)))
    manager.take_cached_prefix(probe)
    assert probe.block_table == [0]  # block 1's hash was evicted with its reallocation


def test_a_hash_collision_is_caught_by_the_stored_tokens():
    manager = BlockManager(num_blocks=8, block_size=BS)
    seq = start(manager, make_seq(list(range(5))))
    block = manager.blocks[seq.block_table[0]]
    manager.cached.pop(block.hash)
    forged = hash((None, (9, 9, 9, 9)))
    manager.cached[forged] = block  # a different token block now maps to this KV
    probe = make_seq([9, 9, 9, 9, 9])
    manager.take_cached_prefix(probe)
    assert probe.block_table == [] and probe.num_computed_tokens == 0


def test_disabled_prefix_caching_never_hits():
    manager = BlockManager(num_blocks=8, block_size=BS, enable_prefix_caching=False)
    start(manager, make_seq(list(range(9)), "a"))
    probe = make_seq(list(range(9)), "b")
    manager.take_cached_prefix(probe)
    assert probe.num_computed_tokens == 0 and not manager.cached


def test_allocation_refuses_when_the_pool_is_short():
    manager = BlockManager(num_blocks=2, block_size=BS)
    seq = make_seq(list(range(12)))
    assert not manager.allocate_slots(seq, 12)
    assert seq.block_table == [] and manager.num_free_blocks == 2
