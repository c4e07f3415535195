"""Which engine serves the chat, and loading it in the background so the server answers while it loads."""

import logging
import threading

from chatsvc.errors import EngineUnavailable
from chatsvc.settings import Settings
from engine.async_engine import AsyncEngine
from engine.model_files import check_model_dir
from engine.protocol import EngineClient, EngineStats

log = logging.getLogger(__name__)
LOADING_RETRY_AFTER_S = 10


def build_engine(settings: Settings) -> EngineClient:
    """The one place that constructs the engine."""
    return AsyncEngine(settings.engine_config())


class EngineLoader:
    """Holds the engine once `start()` has built it in a thread; says why it cannot serve until then."""

    def __init__(self, settings: Settings):
        model_dir = settings.model_path()
        check_model_dir(model_dir)  # a wrong folder fails at once, before the server starts
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

    @property
    def max_model_len(self) -> int | None:
        return self._engine.max_model_len if self._engine is not None else None

    def stats(self) -> EngineStats:
        return self._engine.stats() if self._engine is not None else EngineStats()

    def shutdown(self) -> None:
        if self._engine is not None:
            self._engine.shutdown()
