"""OpenAI's chat-completions shapes, plus our extra fields: session_id, knowledge_base_id, message_id."""

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from chatsvc.api.schemas import Seed, Tokens
from chatsvc.turns import TurnOptions, Usage

# OpenAI takes 4 stop strings; clients written for servers without a limit (vLLM) send a few more.  Each new
# token is checked against every one of them, so both their number and their length are bounded.
StopText = Annotated[str, Field(max_length=256)]
StopList = Annotated[list[StopText], Field(max_length=16)]


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(part.text for part in self.content)


class StreamOptions(BaseModel):
    include_usage: bool = False


class ChatCompletionRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")  # OpenAI clients send fields we do not use (user, metadata...)

    model: str | None = Field(None, description="the served model's name (GET /v1/models); another gets 404")
    messages: list[ChatMessage] = Field(min_length=1, max_length=1000, description="oldest first, 1 to 1000")
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    max_tokens: Tokens | None = None
    max_completion_tokens: Tokens | None = None
    stop: StopText | StopList | None = None
    seed: Seed | None = None
    n: Literal[1] = 1
    session_id: str | None = Field(
        None, description="continue this stored session; send only the new message"
    )
    knowledge_base_id: str | None = Field(None, description="answer from this knowledge base, citing sources")

    def turn_options(self) -> TurnOptions:
        stop = [self.stop] if isinstance(self.stop, str) else self.stop or []
        return TurnOptions(
            self.max_completion_tokens or self.max_tokens, self.temperature, self.top_p, stop, self.seed
        )

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class PromptTokensDetails(BaseModel):
    cached_tokens: int


class CompletionUsage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails

    @classmethod
    def of(cls, usage: Usage) -> "CompletionUsage":
        return cls(
            prompt_tokens=usage.prompt_tokens,
            completion_tokens=usage.completion_tokens,
            total_tokens=usage.prompt_tokens + usage.completion_tokens,
            prompt_tokens_details=PromptTokensDetails(cached_tokens=usage.cached_tokens),
        )


class ReplyMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class Choice(BaseModel):
    index: int = 0
    message: ReplyMessage
    finish_reason: str | None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: CompletionUsage
    session_id: str
    message_id: int  # the stored reply, for /api/messages/{id} (regenerate, inspect)


class Delta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChunkChoice(BaseModel):
    index: int = 0
    delta: Delta
    finish_reason: str | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: CompletionUsage | None = None
    session_id: str
    message_id: int


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "kvchat"
    max_model_len: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
