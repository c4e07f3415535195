"""Session KV: what a chat session keeps in the pool between its turns.

When a request with a session id finishes, the session takes a reference on every block the request
computed, outside the prefix cache's LRU, and remembers which token and text position each KV slot
holds.  The next turn's prompt is matched against the session's text: the longest common prefix is reused
and only the rest is prefilled.  A session may hold fewer slots than its text has tokens: compressing
removes slots from the middle, and the survivors keep their original positions (RoPE was applied when
they were computed), while new tokens continue from the text's length.

This module is mechanism only.  Which tokens to keep, when to compress, and where an offloaded session
goes (disk) is policy, supplied through SessionHooks by the memory package.  Moving a session out of
the pool and back goes through SessionSnapshot: CPU tensors and lists, independent of block ids.
"""

import time
from dataclasses import dataclass, field
from typing import Protocol

import torch

from engine.block_manager import BlockManager, blocks_for
from engine.kv_cache import KvCache, SlotsKv
from engine.sequence import Sequence


@dataclass
class EvictionRecord:
    time: float  # time.time()
    tokens_before: int
    tokens_after: int
    kept_spans: list[tuple[int, int]]  # [start, end) text positions kept


@dataclass(eq=False)
class SessionKV:
    session_id: str
    text_token_ids: list[int]  # every token of the conversation so far: what a next prompt starts with
    token_ids: list[int]  # per KV slot, its token
    positions: list[int]  # per KV slot, its position in the text
    block_ids: list[int]  # blocks this session holds one reference on (empty while a turn runs)
    last_used: float = field(default_factory=time.monotonic)
    running: str | None = None  # id of the request running on this session's KV
    evicted_tokens: int = 0
    evictions: list[EvictionRecord] = field(default_factory=list)

    @property
    def num_slots(self) -> int:
        return len(self.token_ids)


@dataclass
class SessionSnapshot:
    session_id: str
    text_token_ids: list[int]
    token_ids: list[int]
    positions: list[int]
    kv: SlotsKv  # on the CPU, in the form the pool stores it
    evicted_tokens: int = 0
    evictions: list[EvictionRecord] = field(default_factory=list)


class SessionHooks(Protocol):
    """Policy, called on the engine's thread."""

    def after_turn(self, sessions: "SessionCache", session: SessionKV) -> None:
        """A turn finished and the session holds its KV: compress or move sessions out if over budget."""

    def offloaded(self, snapshot: SessionSnapshot) -> None:
        """The pool needed room: this idle session left it (the hook may keep it, e.g. on disk)."""


def common_prefix(a: list[int], b: list[int]) -> int:
    length = min(len(a), len(b))
    for index in range(length):
        if a[index] != b[index]:
            return index
    return length


class SessionCache:
    def __init__(self, block_manager: BlockManager, kv_cache: KvCache):
        self.block_manager = block_manager
        self.kv_cache = kv_cache
        self.sessions: dict[str, SessionKV] = {}
        self.hooks: SessionHooks | None = None
        self.reused_tokens = 0  # prompt tokens served from session KV instead of prefill

    @property
    def block_size(self) -> int:
        return self.block_manager.block_size

    def held_blocks(self) -> int:
        return sum(len(session.block_ids) for session in self.sessions.values())

    def attach(self, seq: Sequence) -> None:
        """Start a new turn on the session's KV: reuse the longest common prefix, release the rest."""
        session = self.sessions.get(seq.session_id)
        if session is None or session.running is not None or seq.output_token_ids:
            return
        # The last prompt token is always computed: its logits pick the first reply token.
        text_match = min(
            common_prefix(session.text_token_ids, seq.prompt_token_ids), seq.num_prompt_tokens - 1
        )
        reused = sum(1 for position in session.positions if position < text_match)
        keep_blocks = blocks_for(reused, self.block_size)
        self.block_manager.release(session.block_ids[keep_blocks:])
        seq.block_table = self.copy_on_write(session.block_ids[:keep_blocks], reused)
        seq.continue_session(session.token_ids[:reused], session.positions[:reused], text_match)
        seq.num_computed_tokens = reused
        session.block_ids = []
        session.running = seq.request_id
        session.last_used = time.monotonic()

    def detach(self, seq: Sequence) -> None:
        """Undo `attach` for a sequence that could not start: the session holds what was reused again."""
        session = self.sessions[seq.session_id]
        reused = seq.session_reused
        session.block_ids, seq.block_table = seq.block_table, []
        session.token_ids, session.positions = session.token_ids[:reused], session.positions[:reused]
        session.text_token_ids = seq.prompt_token_ids[: seq.text_start]
        session.running = None
        seq.reset_to_prompt()

    def attached(self, seq: Sequence) -> bool:
        session = self.sessions.get(seq.session_id)
        return session is not None and session.running == seq.request_id and not seq.output_token_ids

    def copy_on_write(self, block_ids: list[int], reused: int) -> list[int]:
        """A partly reused last block gets new tokens written into it: it must not be shared."""
        if reused % self.block_size == 0 or not block_ids:
            return block_ids
        last = self.block_manager.blocks[block_ids[-1]]
        if last.ref_count == 1 and last.hash is None:
            return block_ids
        if self.block_manager.num_free_blocks == 0:
            self.make_room(1)
        copy = self.block_manager.allocate_block()
        source = self.kv_cache.slot_ids([last.block_id], self.block_size)
        self.kv_cache.write_slots(
            self.kv_cache.slot_ids([copy.block_id], self.block_size), self.kv_cache.read_slots(source)
        )
        self.block_manager.release([last.block_id])
        return [*block_ids[:-1], copy.block_id]

    def retain(self, seq: Sequence) -> SessionKV | None:
        """After a turn: the session takes over the request's computed KV."""
        session = self.sessions.get(seq.session_id)
        if session is not None and session.running not in (None, seq.request_id):
            return None  # another turn of this session owns its KV; this one leaves nothing behind
        if seq.num_computed_tokens < seq.session_reused:  # preempted: the session's KV is gone
            self.sessions.pop(seq.session_id, None)
            return None
        if session is None:
            session = self.sessions[seq.session_id] = SessionKV(seq.session_id, [], [], [], [])
        self.block_manager.release(session.block_ids)
        computed = seq.num_computed_tokens
        session.block_ids = seq.block_table[: blocks_for(computed, self.block_size)]
        for block_id in session.block_ids:
            self.block_manager.acquire(self.block_manager.blocks[block_id])
        session.text_token_ids = seq.session_text()
        session.token_ids = seq.token_ids[:computed]
        session.positions = seq.positions[:computed]
        session.running = None
        session.last_used = time.monotonic()
        return session

    def finished_turn(self, session: SessionKV) -> None:
        if self.hooks is not None:
            self.hooks.after_turn(self, session)

    def snapshot(self, session_id: str, keep: list[int] | None = None) -> SessionSnapshot:
        """The session's KV (or only the slots in `keep`) copied out of the pool."""
        session = self.idle(session_id)
        keep = list(range(session.num_slots)) if keep is None else keep
        slots = self.kv_cache.slot_ids(session.block_ids, session.num_slots)[keep]
        return SessionSnapshot(
            session_id,
            list(session.text_token_ids),
            [session.token_ids[i] for i in keep],
            [session.positions[i] for i in keep],
            self.kv_cache.read_slots(slots).cpu(),
            session.evicted_tokens,
            list(session.evictions),
        )

    def restore(self, snapshot: SessionSnapshot) -> bool:
        """Put a snapshot into the pool as the session's KV; False if the pool cannot hold it."""
        if snapshot.session_id in self.sessions:
            self.drop(snapshot.session_id)
        needed = self.block_manager.blocks_needed(len(snapshot.token_ids))
        if needed > self.block_manager.num_free_blocks:
            self.make_room(needed)
        if needed > self.block_manager.num_free_blocks:
            return False
        block_ids = [self.block_manager.allocate_block().block_id for _ in range(needed)]
        slots = self.kv_cache.slot_ids(block_ids, len(snapshot.token_ids))
        self.kv_cache.write_slots(slots, snapshot.kv)
        self.sessions[snapshot.session_id] = SessionKV(
            snapshot.session_id,
            list(snapshot.text_token_ids),
            list(snapshot.token_ids),
            list(snapshot.positions),
            block_ids,
            evicted_tokens=snapshot.evicted_tokens,
            evictions=list(snapshot.evictions),
        )
        return True

    def compress(self, session_id: str, keep: list[int]) -> EvictionRecord:
        """Keep only the slots in `keep` (sorted), packed into fresh blocks."""
        session = self.idle(session_id)
        snapshot = self.snapshot(session_id, keep)
        record = EvictionRecord(time.time(), session.num_slots, len(keep), spans(snapshot.positions))
        snapshot.evicted_tokens += session.num_slots - len(keep)
        snapshot.evictions.append(record)
        self.drop(session_id)
        restored = self.restore(snapshot)
        assert restored, "a compressed session always fits where the whole one was"
        self.sessions[session_id].last_used = session.last_used
        return record

    def importance(self, session_id: str) -> torch.Tensor:
        """Attention each slot received, summed over layers, heads and queries (CPU, float32)."""
        session = self.sessions[session_id]
        return self.kv_cache.importance[self.kv_cache.slot_ids(session.block_ids, session.num_slots)].cpu()

    def drop(self, session_id: str) -> None:
        session = self.sessions.pop(session_id, None)
        if session is not None:
            self.block_manager.release(session.block_ids)

    def make_room(self, blocks: int) -> None:
        """Move idle sessions out of the pool, least recently used first, until `blocks` are free."""
        idle = sorted((s for s in self.sessions.values() if s.running is None), key=lambda s: s.last_used)
        for session in idle:
            if self.block_manager.num_free_blocks >= blocks:
                return
            snapshot = self.snapshot(session.session_id) if self.hooks is not None else None
            self.drop(session.session_id)
            if snapshot is not None:
                self.hooks.offloaded(snapshot)

    def idle(self, session_id: str) -> SessionKV:
        session = self.sessions.get(session_id)
        if session is None:
            raise ValueError(f"session {session_id!r} has no KV in the pool")
        if session.running is not None:
            raise ValueError(f"session {session_id!r} is running a turn")
        return session


def spans(positions: list[int]) -> list[tuple[int, int]]:
    """Maximal runs of consecutive positions, as [start, end)."""
    runs: list[tuple[int, int]] = []
    for position in positions:
        if runs and runs[-1][1] == position:
            runs[-1] = (runs[-1][0], position + 1)
        else:
            runs.append((position, position + 1))
    return runs
