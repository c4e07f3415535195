from dataclasses import dataclass
from pathlib import Path

from memory.session_memory import kv_files


@dataclass
class MemoryConfig:
    data_dir: Path  # session KV files go to data_dir / "sessions"
    session_budget_tokens: int = 2048  # KV slots one session may keep between turns
    global_budget_tokens: int = 32768  # KV slots all idle sessions may keep in the pool together
    sink_tokens: int = 4  # the first tokens, which soak up attention whatever they say
    recent_tokens: int = 256  # the latest tokens, kept whole
    heavy_hitters: bool = True  # False keeps sinks + recent only (StreamingLLM), the baseline
    idle_seconds: float = 120.0  # a session unused this long is written to disk (and kept in the pool)

    def __post_init__(self):
        if self.session_budget_tokens < self.sink_tokens + self.recent_tokens + 1:
            raise ValueError(
                f"session_budget_tokens ({self.session_budget_tokens}) must exceed "
                f"sink_tokens + recent_tokens ({self.sink_tokens + self.recent_tokens})"
            )
        if self.global_budget_tokens < self.session_budget_tokens:
            raise ValueError("global_budget_tokens must be at least session_budget_tokens")
        if self.idle_seconds <= 0:
            raise ValueError("idle_seconds must be > 0")

    def session_file(self, session_id: str) -> Path:
        """Where the session's KV is kept on disk: the one place that names it (raises ValueError for an id
        that is not a file name)."""
        return kv_files.session_file(Path(self.data_dir) / "sessions", session_id)
