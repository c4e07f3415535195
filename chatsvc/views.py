"""What the service's knowledge-base and admin methods return (to the UI directly, to the API as JSON)."""

from dataclasses import dataclass, field
from datetime import datetime

from chatsvc.models import ChatSession, EvictionEvent, Message
from memory.retrieval import Hit, Passage


@dataclass
class QueryPreview:
    """What a question would retrieve from a knowledge base: the window a turn would get, and the top hits."""

    intent: str
    intent_reason: str
    budget_tokens: int
    num_tokens: int
    latency_ms: float
    passages: list[Passage]
    hits: list[Hit]


@dataclass
class EmbeddingModel:
    """A knowledge base's encoder: named by its first document's language unless its owner chose one."""

    name: str | None  # None until the knowledge base has a document or a chosen model
    choices: list[str]


@dataclass
class SessionKvRow:
    session_id: str
    title: str
    owner: str
    turns: int  # user messages, every branch
    tokens: int | None  # the conversation's length: the latest reply's prompt and completion tokens
    kv_location: str | None  # pool, disk or none; None: never recorded, or no session KV in this engine
    kv_cached_tokens: int | None
    kv_evicted_tokens: int | None
    kv_bytes_on_disk: int | None
    last_activity: datetime
    generating: bool


@dataclass
class KvState:
    """A session's KV right now, from the session memory."""

    available: bool
    note: str | None = None  # why it is not available, or what to know about it
    location: str | None = None  # pool, disk or none
    cached_tokens: int = 0
    text_tokens: int = 0
    blocks: int = 0
    evicted_tokens: int = 0
    bytes_on_disk: int = 0
    positions: list[int] = field(default_factory=list)  # text position of each kept KV slot
    importance: list[float] = field(default_factory=list)  # attention each kept slot received
    warning: str | None = None  # the last reason a saved KV could not be used


@dataclass
class SessionKvDetail:
    session: ChatSession
    owner: str
    messages: list[Message]  # the active branch, oldest first
    kv: KvState
    eviction_events: list[EvictionEvent]  # oldest first


@dataclass
class EnginePanel:
    state: str  # loading, ready, failed, dead
    running: int
    waiting: int
    kv_usage: float  # fraction of the KV pool in use
    kv_blocks_used: int
    kv_blocks_total: int
    prefix_cache_hit_rate: float | None  # over the window, else since start; None before any lookup
    generation_tokens_per_s: float | None  # over the window; None until two polls
    prompt_tokens_per_s: float | None
    ttft_p50_s: float | None  # time to first token as users saw it, over the window
    ttft_p99_s: float | None
    window_s: float
    session_memory: dict[str, int] | None  # session KV counters; None without session KV
    weights: str = ""  # dtype, quantization and size of the weights
    kv_pool: str = ""  # dtype, size and capacity of the KV block pool
    speculative: str = ""  # drafting method and acceptance; empty when off
    embedding_models: str = ""  # the retriever's encoders and how many collections each serves
    note: str | None = None
