"""Which engine serves the chat, and loading it in the background so the server answers while it loads."""

import logging
import threading

from chatsvc.errors import EngineUnavailable, NotAvailable
from chatsvc.load_monitor import kv_pool_line, weights_line
from chatsvc.settings import Settings
from engine.async_engine import AsyncEngine
from engine.model_files import check_model_dir
from engine.protocol import EngineClient, EngineStats
from memory.session_memory.session_memory import SessionMemory

log = logging.getLogger(__name__)
LOADING_RETRY_AFTER_S = 10


def build_engine(settings: Settings) -> EngineClient:
    """The one place that constructs the engine: ours under the session memory, or vLLM's."""
    if settings.engine == "vllm":
        from engine.vllm_backend import VllmEngine  # imports vllm: only where it is installed

        return VllmEngine(settings.model_path(), settings.vllm_options())
    return SessionMemory(AsyncEngine(settings.engine_config()), settings.memory_config())


def session_memory(engine: EngineClient) -> SessionMemory | None:
    """The one place that asks whether an engine keeps sessions' KV (a vLLM backend does not)."""
    return engine if isinstance(engine, SessionMemory) else None


NO_SESSION_KV = "not available with this engine: it does not keep sessions' KV"


class EngineLoader:
    """Holds the engine once `start()` has built it in a thread; says why it cannot serve until then."""

    def __init__(self, settings: Settings):
        model_dir = settings.model_path()
        check_model_dir(model_dir)  # a wrong folder fails at once, before the server starts
        settings.memory_config()  # and so do contradicting budgets
        self.model_name = model_dir.name
        self._settings = settings
        self._engine: EngineClient | None = None
        self._error: str | None = None
        self._thread = threading.Thread(target=self._load, name="engine-loader", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _load(self) -> None:
        try:
            self._engine = build_engine(self._settings)
        except Exception as error:
            log.exception("the engine failed to load")
            self._error = f"the engine failed to load: {error}"
            return
        stats = self._engine.stats()
        if stats.dtype:
            log.info(
                "model loaded: weights %s; KV pool %s; speculative decoding %s",
                weights_line(stats),
                kv_pool_line(stats),
                stats.speculative,
            )

    @property
    def state(self) -> str:
        if self._engine is not None:
            return "ready" if self._engine.is_healthy() else "dead"
        return "failed" if self._error else "loading"

    def ready(self) -> EngineClient:
        state = self.state
        if state == "ready":
            return self._engine
        if state == "loading":
            raise EngineUnavailable("the model is still loading", retry_after_s=LOADING_RETRY_AFTER_S)
        raise EngineUnavailable(self._error or "the engine stopped working; see the server log")

    def session_memory(self) -> SessionMemory:
        """The session memory, for session-KV features; NotAvailable on an engine without one."""
        memory = session_memory(self.ready())
        if memory is None:
            raise NotAvailable(NO_SESSION_KV)
        return memory

    async def forget_session_kv(self, session_id: str) -> None:
        """A deleted session's KV goes, in the pool and on disk (only the file while the engine loads)."""
        if self.state != "ready":  # loading, failed or dead: only its file is there to delete
            self._settings.memory_config().session_file(session_id).unlink(missing_ok=True)
        elif (memory := session_memory(self._engine)) is not None:
            await memory.close_session(session_id)

    def memory_stats(self) -> dict[str, int] | None:
        """The session memory's counters; None while loading, on a dead engine, or without session KV."""
        memory = session_memory(self._engine) if self.state == "ready" else None
        return memory.memory_stats() if memory is not None else None

    @property
    def max_model_len(self) -> int | None:
        return self._engine.max_model_len if self._engine is not None else None

    def stats(self) -> EngineStats:
        return self._engine.stats() if self._engine is not None else EngineStats()

    def shutdown(self) -> None:
        if self._engine is not None:
            self._engine.shutdown()
