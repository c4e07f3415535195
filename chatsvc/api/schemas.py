"""Request and response shapes of the REST API under /api (the tables live in chatsvc.models)."""

from datetime import datetime
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, computed_field

from chatsvc.chat_sessions import age_group
from chatsvc.logins import PASSWORD_MAX, PASSWORD_MIN
from chatsvc.models import MessageStatus, Role, utcnow
from chatsvc.turns import TurnOptions
from chatsvc.views import KvState, SessionKvRow
from memory.retrieval import Document, Rejected

Title = Annotated[str, Field(min_length=1, max_length=200)]
SystemPrompt = Annotated[str, Field(max_length=50_000)]
Temperature = Annotated[float, Field(ge=0, le=2)]

# Every integer a request sends is bounded: one past what a database column holds would be a 500.
DB_INT_MAX = 2**31 - 1  # ids are INTEGER columns, 32 bits on Postgres
MAX_TOKENS = 2**24  # beyond any model's context; the engine checks the served model's own length
Id = Annotated[int, Field(ge=1, le=DB_INT_MAX)]
Offset = Annotated[int, Field(ge=0, le=DB_INT_MAX)]
PageSize = Annotated[int, Field(ge=1, le=500)]
Tokens = Annotated[int, Field(ge=1, le=MAX_TOKENS)]
Seed = Annotated[int, Field(ge=-(2**63), le=2**63 - 1)]  # 64 bits, as vLLM and torch.Generator take them


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a misspelt field is an error, not silently ignored


class FromRow(BaseModel):
    model_config = ConfigDict(from_attributes=True)


class Detail(BaseModel):
    detail: str


# --- users and keys ---


Password = Annotated[str, Field(min_length=PASSWORD_MIN, max_length=PASSWORD_MAX)]


class UserPublic(FromRow):
    id: int
    username: str
    role: Role
    disabled: bool
    created_at: datetime


class UserCreate(Strict):
    username: str = Field(pattern=r"^[A-Za-z0-9_.@-]{1,64}$")
    role: Role = Role.user
    password: Password | None = None


class UserUpdate(Strict):
    """Left out = unchanged.  A new password or disabled=true ends the user's UI logins."""

    password: Password = None
    disabled: bool = None
    role: Role = None


class PasswordChange(Strict):
    current_password: str = Field(max_length=PASSWORD_MAX)
    new_password: Password


class UserCreated(UserPublic):
    api_key: str  # shown once


class UserList(BaseModel):
    data: list[UserPublic]
    count: int


class ApiKeyCreate(Strict):
    name: str = Field(min_length=1, max_length=100)


class ApiKeyPublic(FromRow):
    id: int
    name: str
    created_at: datetime


class ApiKeyCreated(ApiKeyPublic):
    key: str  # shown once; only its hash is stored


class ApiKeyList(BaseModel):
    data: list[ApiKeyPublic]
    count: int


# --- knowledge bases ---


class KnowledgeBaseCreate(Strict):
    name: Title


class KnowledgeBasePublic(FromRow):
    id: str
    name: str
    created_at: datetime


class KnowledgeBaseList(BaseModel):
    data: list[KnowledgeBasePublic]
    count: int


class DocumentList(BaseModel):
    data: list[Document]  # with its paragraph count
    count: int


class UploadResponse(BaseModel):
    added: list[Document]
    rejected: list[Rejected]  # each file that did not go in, with the reason


class EmbeddingModelChoice(Strict):
    embedding_model: str = Field(min_length=1, max_length=64)


class QueryRequest(Strict):
    query: str = Field(min_length=1, max_length=2000)
    k: int = Field(5, ge=1, le=50)


# --- sessions and messages ---


class SessionCreate(Strict):
    title: str = Field("", max_length=200)
    system_prompt: SystemPrompt | None = None
    knowledge_base_id: str | None = None
    temperature: Temperature | None = None
    kv_budget_tokens: Tokens | None = None


class SessionUpdate(Strict):
    # Left out = unchanged.  These three cannot be null: the default is not validated, a sent null is.
    title: Title = None
    archived: bool = None
    pinned: bool = None
    system_prompt: SystemPrompt | None = None
    knowledge_base_id: str | None = None
    temperature: Temperature | None = None
    kv_budget_tokens: Tokens | None = None


class SessionPublic(FromRow):
    id: str
    title: str
    created_at: datetime
    updated_at: datetime
    archived: bool
    pinned: bool
    system_prompt: str | None
    knowledge_base_id: str | None
    temperature: float | None
    kv_budget_tokens: int | None

    @computed_field
    @property
    def group(self) -> str:
        """Sidebar group: Pinned, Today, Yesterday, Previous 7 days, Previous 30 days, Older."""
        return "Pinned" if self.pinned else age_group(self.updated_at, utcnow())


class SessionList(BaseModel):
    data: list[SessionPublic]
    count: int  # all matches, beyond this page too


class MessagePublic(FromRow):
    id: int
    session_id: str
    parent_id: int | None
    role: str
    content: str
    context: list[dict] | None  # the sources that traveled with a user message
    retrieval: dict | None  # how they were chosen: intent, window, latency
    status: MessageStatus
    error: str | None
    finish_reason: str | None
    prompt_tokens: int | None
    cached_tokens: int | None
    completion_tokens: int | None
    ttft_seconds: float | None
    tokens_per_second: float | None
    draft_tokens: int | None  # speculative decoding: tokens drafted for this reply
    accepted_tokens: int | None  # of those, accepted
    citations: list[dict] | None
    created_at: datetime
    updated_at: datetime


class MessageList(BaseModel):
    data: list[MessagePublic]
    count: int


class SessionDetail(SessionPublic):
    messages: list[MessagePublic]  # the active branch, oldest first

    @classmethod
    def of(cls, session, messages: list) -> "SessionDetail":
        public = SessionPublic.model_validate(session).model_dump(exclude={"group"})
        return cls(**public, messages=[MessagePublic.model_validate(message) for message in messages])


class GenerationOptions(Strict):
    max_tokens: Tokens | None = None
    temperature: Temperature | None = None
    top_p: float = Field(1.0, gt=0, le=1)
    seed: Seed | None = None

    def turn_options(self) -> TurnOptions:
        return TurnOptions(self.max_tokens, self.temperature, self.top_p, [], self.seed)


class EditRequest(GenerationOptions):
    content: str = Field(min_length=1)


class TurnPublic(BaseModel):
    session_id: str
    reply: MessagePublic


class StopResult(BaseModel):
    stopped: bool  # False: no reply was generating


# --- admin: session KV ---


class SessionKvList(BaseModel):
    data: list[SessionKvRow]
    count: int  # all matches, beyond this page too


class EvictionEventPublic(FromRow):
    id: int
    created_at: datetime
    policy: str
    num_tokens_before: int
    num_tokens_evicted: int
    details: dict | None  # tokens_after, kept_spans ([start, end) text positions), time


class SessionKvDetailPublic(FromRow):
    session: SessionPublic
    owner: str
    messages: list[MessagePublic]  # the active branch, with each user message's retrieval
    kv: KvState
    eviction_events: list[EvictionEventPublic]


class Health(BaseModel):
    status: str  # ok, loading, failed, dead
    model: str
