"""The session memory the chat service talks to: an EngineClient over the native engine that keeps each
session's KV across turns, within a per-session and a global budget, and on disk when idle.

Policy runs here; the engine's SessionCache does the moving.  Budget decisions run on the engine thread
(SessionHooks), right after a turn, so no step sees a session over budget; disk writes and reads never
run there: a writer thread saves snapshots, and a turn's KV is read back before its request is added.
"""

import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

import torch

from engine.outputs import StreamDelta
from engine.protocol import EngineClient, EngineStats
from engine.sampling_params import SamplingParams
from engine.session_kv import EvictionRecord, SessionCache, SessionKV, SessionSnapshot
from engine.threads import single_threaded_torch, to_passing_thread
from memory.session_memory import kv_files
from memory.session_memory.config import MemoryConfig
from memory.session_memory.eviction import choose_slots

log = logging.getLogger(__name__)
T = TypeVar("T")


class SessionKvEngine(EngineClient, Protocol):
    """What session memory needs of an engine (engine.AsyncEngine is one): its session KV, touched only
    through commands run on the engine's thread, and the identity a saved KV must match."""

    @property
    def session_kv(self) -> SessionCache: ...

    @property
    def kv_identity(self) -> tuple[str, torch.dtype]: ...

    async def call(self, command: Callable[[], T]) -> T: ...

    def call_sync(self, command: Callable[[], T], timeout: float | None = None) -> T: ...


@dataclass
class SessionOptions:
    budget_tokens: int | None = None  # None: the configured default
    protected_tokens: int = 0  # leading text tokens never evicted (the system prompt)


@dataclass
class SessionInfo:
    session_id: str
    location: str  # "pool", "disk" or "none"
    cached_tokens: int = 0  # KV slots held
    text_tokens: int = 0  # tokens of the conversation those slots summarise
    blocks: int = 0
    evicted_tokens: int = 0
    bytes_on_disk: int = 0
    positions: list[int] = field(default_factory=list)  # text position of each slot
    importance: list[float] = field(default_factory=list)  # attention each slot received, summed
    evictions: list[EvictionRecord] = field(default_factory=list)
    warning: str | None = None  # the last reason a saved KV could not be used


class SessionMemory:
    def __init__(self, engine: SessionKvEngine, config: MemoryConfig):
        self.engine = engine
        self.config = config
        self.model_name = engine.model_name
        self.max_model_len = engine.max_model_len
        self.cache = engine.session_kv
        self.fingerprint, self.dtype = engine.kv_identity
        self.options: dict[str, SessionOptions] = {}
        self.warnings: dict[str, str] = {}
        self.saved: dict[str, float] = {}  # session id -> last_used of the KV on disk
        self.pending: dict[str, SessionSnapshot] = {}  # offloaded, not yet written
        self.writes: queue.Queue[SessionSnapshot | None] = queue.Queue()
        self.counters = {"evictions": 0, "offloads": 0, "restores": 0, "restore_failures": 0}
        self.stopping = threading.Event()
        self.writer = threading.Thread(target=self.write_loop, name="session-writer", daemon=True)
        self.idle_saver = threading.Thread(target=self.idle_loop, name="session-idle-saver", daemon=True)
        self.writer.start()
        self.idle_saver.start()
        engine.call_sync(lambda: setattr(self.cache, "hooks", self))

    # EngineClient
    @property
    def tokenizer(self):
        return self.engine.tokenizer

    async def generate(
        self, prompt, params: SamplingParams, request_id: str, session_id: str | None = None
    ) -> AsyncIterator[StreamDelta]:
        if session_id is not None:
            await self.resume(session_id)
        async for delta in self.engine.generate(prompt, params, request_id, session_id):
            yield delta

    async def abort(self, request_id: str) -> None:
        await self.engine.abort(request_id)

    def stats(self) -> EngineStats:
        return self.engine.stats()

    def is_healthy(self) -> bool:
        return self.engine.is_healthy() and self.writer.is_alive()

    def shutdown(self) -> None:
        """Save every session still in the pool, then stop."""
        self.stopping.set()
        if self.engine.is_healthy():
            for session_id in self.engine.call_sync(lambda: list(self.cache.sessions)):
                self.save_now(session_id)
        self.writes.put(None)
        self.writer.join(timeout=60)
        self.engine.shutdown()

    # Sessions
    def open_session(
        self, session_id: str, budget_tokens: int | None = None, protected_tokens: int = 0
    ) -> None:
        self.config.session_file(session_id)  # validates the id
        self.options[session_id] = SessionOptions(budget_tokens, protected_tokens)

    async def resume(self, session_id: str) -> bool:
        """Bring the session's KV into the pool, from memory or disk; False when there is none to use."""
        if await self.engine.call(lambda: session_id in self.cache.sessions):
            return True
        snapshot = self.pending.get(session_id) or await to_passing_thread(self.read, session_id)
        if snapshot is None:
            return False
        restored = await self.engine.call(lambda: self.cache.restore(snapshot))
        self.counters["restores"] += restored
        return restored

    async def persist(self, session_id: str) -> int:
        """Write the session's KV to disk now (it stays in the pool); returns bytes written."""
        return await to_passing_thread(self.save_now, session_id)

    async def evict(self, session_id: str) -> int:
        """Move the session's KV out of the pool onto disk; returns bytes written."""
        written = await self.persist(session_id)
        await self.engine.call(lambda: self.cache.drop(session_id))
        return written

    async def drop(self, session_id: str) -> None:
        """Forget the session's KV, in the pool and on disk (the conversation itself is not touched)."""
        await self.engine.call(lambda: self.cache.drop(session_id))
        self.pending.pop(session_id, None)
        self.saved.pop(session_id, None)
        self.config.session_file(session_id).unlink(missing_ok=True)

    async def close_session(self, session_id: str) -> None:
        await self.drop(session_id)
        self.options.pop(session_id, None)
        self.warnings.pop(session_id, None)

    async def session_info(self, session_id: str) -> SessionInfo:
        info = await self.engine.call(lambda: self.pool_info(session_id))
        path = self.config.session_file(session_id)
        info.bytes_on_disk = path.stat().st_size if path.is_file() else 0
        info.location = located(info.location, info.bytes_on_disk)
        info.warning = self.warnings.get(session_id)
        return info

    def pool_info(self, session_id: str) -> SessionInfo:
        session = self.cache.sessions.get(session_id)
        if session is None or session.running is not None:
            return SessionInfo(session_id, "pool" if session else "none")
        return SessionInfo(
            session_id,
            "pool",
            session.num_slots,
            len(session.text_token_ids),
            len(session.block_ids),
            session.evicted_tokens,
            positions=list(session.positions),
            importance=self.cache.importance(session_id).tolist(),
            evictions=list(session.evictions),
        )

    def memory_stats(self) -> dict[str, int]:
        in_pool = self.engine.call_sync(lambda: (len(self.cache.sessions), self.cache.held_blocks()))
        return {
            "sessions_in_pool": in_pool[0],
            "session_blocks": in_pool[1],
            **self.counters,
            "reused_tokens": self.cache.reused_tokens,
        }

    # SessionHooks: on the engine thread
    def after_turn(self, cache: SessionCache, session: SessionKV) -> None:
        options = self.options.get(session.session_id, SessionOptions())
        budget = options.budget_tokens or self.config.session_budget_tokens
        if session.num_slots > budget:
            keep = choose_slots(
                session.positions,
                cache.importance(session.session_id),
                budget,
                self.config.sink_tokens,
                self.config.recent_tokens,
                options.protected_tokens,
                self.config.heavy_hitters,
            )
            cache.compress(session.session_id, keep)
            self.counters["evictions"] += 1
        for idle in sorted(cache.sessions.values(), key=lambda s: s.last_used):
            if idle_slots(cache) <= self.config.global_budget_tokens:
                break
            if idle.running is None and idle is not session:
                self.offloaded(cache.snapshot(idle.session_id))
                cache.drop(idle.session_id)

    def offloaded(self, snapshot: SessionSnapshot) -> None:
        self.counters["offloads"] += 1
        self.pending[snapshot.session_id] = snapshot
        self.writes.put(snapshot)

    # Disk
    def read(self, session_id: str) -> SessionSnapshot | None:
        path = self.config.session_file(session_id)
        if not path.exists():
            return None
        try:
            return kv_files.load(path, self.fingerprint, self.dtype)
        except kv_files.SnapshotError as error:
            self.counters["restore_failures"] += 1
            self.warnings[session_id] = f"saved KV not used, recomputing: {error}"
            log.warning("session %s: saved KV not used, recomputing: %s", session_id, error)
            path.unlink(missing_ok=True)
            return None

    def save_now(self, session_id: str) -> int:
        def take() -> SessionSnapshot | None:
            session = self.cache.sessions.get(session_id)
            return None if session is None or session.running else self.cache.snapshot(session_id)

        snapshot = self.engine.call_sync(take)
        return self.write(snapshot) if snapshot is not None else 0

    def write(self, snapshot: SessionSnapshot) -> int:
        path = self.config.session_file(snapshot.session_id)
        written = kv_files.save(snapshot, path, self.fingerprint)
        if self.pending.get(snapshot.session_id) is snapshot:
            del self.pending[snapshot.session_id]
        return written

    def write_loop(self) -> None:
        single_threaded_torch()  # a live thread must not own OpenMP workers (engine/threads.py)
        while (snapshot := self.writes.get()) is not None:
            try:
                self.write(snapshot)
            except OSError:
                log.exception("session %s: could not write its KV", snapshot.session_id)

    def idle_loop(self) -> None:
        single_threaded_torch()
        while not self.stopping.wait(min(5.0, self.config.idle_seconds / 4)):
            if not self.engine.is_healthy():
                return
            for session_id, last_used in self.engine.call_sync(self.idle_sessions):
                self.save_now(session_id)
                self.saved[session_id] = last_used

    def idle_sessions(self) -> list[tuple[str, float]]:
        """Sessions idle long enough whose KV changed since it was last saved (engine thread)."""
        cutoff = time.monotonic() - self.config.idle_seconds
        return [
            (s.session_id, s.last_used)
            for s in self.cache.sessions.values()
            if s.running is None and s.last_used < cutoff and self.saved.get(s.session_id) != s.last_used
        ]


def located(in_pool: str, bytes_on_disk: int) -> str:
    """pool or none as the pool says, except that a session out of the pool whose file holds KV is on disk."""
    return "disk" if in_pool == "none" and bytes_on_disk else in_pool


def idle_slots(cache: SessionCache) -> int:
    return sum(session.num_slots for session in cache.sessions.values() if session.running is None)
