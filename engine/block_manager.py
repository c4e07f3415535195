"""The KV block pool: allocation, reference counts, and the prefix cache over full blocks.

A full block is known by a hash chained from its parent block's hash and its own token ids; a hit is
confirmed against the stored (parent hash, token ids), so a hash collision can never hand out wrong KV.
Freed blocks keep their hash and stay reusable until they are reallocated; the free queue is LRU, and a
sequence frees its blocks tail first, so the ends of chains are evicted before their shared heads.
"""

from collections import OrderedDict
from dataclasses import dataclass

from engine.sequence import Sequence

BlockKey = tuple[int | None, tuple[int, ...]]  # (parent block's hash, this block's token ids)


def blocks_for(num_tokens: int, block_size: int) -> int:
    """Blocks that hold `num_tokens` tokens (the last one may be part full)."""
    return -(-num_tokens // block_size)


@dataclass(eq=False)
class Block:
    block_id: int
    ref_count: int = 0
    hash: int | None = None
    key: BlockKey | None = None


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_queue: OrderedDict[int, Block] = OrderedDict((b.block_id, b) for b in self.blocks)
        self.cached: dict[int, Block] = {}  # hash -> block holding that KV
        self.prefix_queries = 0  # prompt tokens looked up
        self.prefix_hits = 0  # prompt tokens found

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    def blocks_needed(self, num_tokens: int) -> int:
        return blocks_for(num_tokens, self.block_size)

    def take_cached_prefix(self, seq: Sequence) -> None:
        """Start a new (or preempted) sequence on the longest cached prefix of its tokens."""
        if seq.block_table or not seq.contiguous:  # already on its session's KV, or not prefix-shaped
            return
        hits = self.match_prefix(seq.token_ids)
        for block in hits:
            self.acquire(block)
        seq.block_table = [block.block_id for block in hits]
        seq.block_hashes = [block.hash for block in hits]
        seq.num_computed_tokens = len(hits) * self.block_size

    def record_prefix_lookup(self, seq: Sequence) -> None:
        """Count a sequence's first successful start in the hit-rate figures."""
        seq.num_cached_tokens = seq.num_computed_tokens
        self.prefix_queries += seq.num_prompt_tokens
        self.prefix_hits += seq.num_computed_tokens

    def match_prefix(self, token_ids: list[int]) -> list[Block]:
        if not self.enable_prefix_caching:
            return []
        hits: list[Block] = []
        parent = None
        # The last token is always recomputed: its logits are needed to sample the next one.
        for start in range(0, len(token_ids) - 1 - self.block_size + 1, self.block_size):
            key = (parent, tuple(token_ids[start : start + self.block_size]))
            block = self.cached.get(hash(key))
            if block is None or block.key != key:
                break
            hits.append(block)
            parent = block.hash
        return hits

    def allocate_slots(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Make the block table cover num_new_tokens more tokens; False if the pool is short."""
        needed = self.blocks_needed(seq.num_computed_tokens + num_new_tokens) - len(seq.block_table)
        if needed > self.num_free_blocks:
            return False
        for _ in range(needed):
            seq.block_table.append(self.allocate_block().block_id)
        return True

    def allocate_block(self) -> Block:
        _, block = self.free_queue.popitem(last=False)
        if block.hash is not None:
            if self.cached.get(block.hash) is block:
                del self.cached[block.hash]
            block.hash = block.key = None
        block.ref_count = 1
        return block

    def acquire(self, block: Block) -> None:
        if block.ref_count == 0:
            del self.free_queue[block.block_id]
        block.ref_count += 1

    def free(self, seq: Sequence) -> None:
        self.release(seq.block_table)
        seq.block_table = []
        seq.block_hashes = []

    def release(self, block_ids: list[int]) -> None:
        for block_id in reversed(block_ids):
            block = self.blocks[block_id]
            block.ref_count -= 1
            assert block.ref_count >= 0, f"block {block_id} released more often than acquired"
            if block.ref_count == 0:
                self.free_queue[block_id] = block

    def cache_full_blocks(self, seq: Sequence) -> None:
        """Publish the sequence's newly computed full blocks to the prefix cache."""
        if not self.enable_prefix_caching or not seq.contiguous:
            return
        num_full = seq.num_computed_tokens // self.block_size
        for index in range(len(seq.block_hashes), num_full):
            parent = seq.block_hashes[-1] if seq.block_hashes else None
            start = index * self.block_size
            key = (parent, tuple(seq.token_ids[start : start + self.block_size]))
            block_hash = hash(key)
            seq.block_hashes.append(block_hash)
            block = self.blocks[seq.block_table[index]]
            if block.hash is None and block_hash not in self.cached:
                block.hash, block.key = block_hash, key
                self.cached[block_hash] = block
