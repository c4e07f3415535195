"""OpenAI-compatible chat: POST /v1/chat/completions (SSE or not) and GET /v1/models."""

import asyncio
import json
import time
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from chatsvc.api.deps import CurrentUser, ServiceDep
from chatsvc.api.errors import error_body
from chatsvc.api.openai_schemas import (
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    Choice,
    ChunkChoice,
    CompletionUsage,
    Delta,
    ModelCard,
    ModelList,
    ReplyMessage,
)
from chatsvc.errors import NotFound
from chatsvc.models import User
from chatsvc.service import ChatService
from chatsvc.turns import Turn, TurnResult

router = APIRouter(prefix="/v1", tags=["openai"])
SSE = {200: {"content": {"text/event-stream": {}}, "description": "with stream=true: chunks as SSE"}}


@router.post("/chat/completions", response_model=ChatCompletion, responses=SSE)
async def chat_completions(
    body: ChatCompletionRequest, user: CurrentUser, service: ServiceDep, request: Request
):
    _check_model(body.model, service.engines.model_name)
    # The header lets a load balancer route a session to the replica holding its KV (docs/scale-out.md).
    body.session_id = body.session_id or request.headers.get("x-session-id")
    turn = await _start_turn(service, user, body)
    if body.stream:
        return StreamingResponse(_sse(turn, body.include_usage), media_type="text/event-stream")
    result = await until_done(turn, request)
    if result.error is not None:
        raise result.error
    return ChatCompletion(
        id=_completion_id(turn),
        created=turn.created,
        model=turn.model_name,
        choices=[Choice(message=ReplyMessage(content=result.text), finish_reason=result.finish_reason)],
        usage=CompletionUsage.of(result.usage),
        session_id=turn.session_id,
        message_id=turn.reply_id,
    )


@router.get("/models", response_model=ModelList)
def list_models(user: CurrentUser, service: ServiceDep) -> ModelList:
    engines = service.engines
    card = ModelCard(id=engines.model_name, created=int(time.time()), max_model_len=engines.max_model_len)
    return ModelList(data=[card])


def _check_model(requested: str | None, served: str) -> None:
    """As in vLLM: no name (or an empty one) means the served model; another name is an error, not
    silently answered by a different model."""
    if requested and requested != served:
        raise NotFound(f"The model `{requested}` does not exist.")


async def _start_turn(service: ChatService, user: User, body: ChatCompletionRequest) -> Turn:
    *earlier, last = body.messages
    if last.role != "user":
        raise ValueError("the last message must be the user's new message")
    options = body.turn_options()
    if body.session_id is not None:
        if earlier:
            raise ValueError("with session_id, send only the new user message: the server holds the history")
        return await service.turns.send(user, body.session_id, last.text(), options, body.knowledge_base_id)
    system = [m.text() for m in earlier if m.role in ("system", "developer")]
    history = [(m.role, m.text()) for m in earlier if m.role in ("user", "assistant")]
    system_prompt = "\n\n".join(system) or None
    return await service.turns.start_session(
        user, last.text(), options, system_prompt, body.knowledge_base_id, history
    )


async def until_done(turn: Turn, request: Request) -> TurnResult:
    """The finished reply; a client that hangs up first aborts it."""

    async def abort_on_disconnect():
        while (await request.receive())["type"] != "http.disconnect":
            pass
        turn.cancel()

    watcher = asyncio.create_task(abort_on_disconnect())
    try:
        return await turn.result()
    finally:
        watcher.cancel()


async def _sse(turn: Turn, include_usage: bool) -> AsyncIterator[str]:
    """Chunks as the reply grows; closing the stream early aborts the reply (stored as aborted)."""

    def chunk(delta: Delta, finish_reason: str | None = None) -> str:
        choice = ChunkChoice(delta=delta, finish_reason=finish_reason)
        return _event(_chunk(turn, [choice]).model_dump_json(exclude_none=True))

    try:
        yield chunk(Delta(role="assistant", content=""))
        async for piece in turn.stream():
            yield chunk(Delta(content=piece))
        result = await turn.result()
        if result.error is not None:
            yield _event(json.dumps(error_body(result.error)))
        else:
            yield chunk(Delta(), result.finish_reason)
        if include_usage:
            yield _event(_chunk(turn, [], CompletionUsage.of(result.usage)).model_dump_json())
        yield _event("[DONE]")
    finally:
        turn.cancel()


def _chunk(
    turn: Turn, choices: list[ChunkChoice], usage: CompletionUsage | None = None
) -> ChatCompletionChunk:
    return ChatCompletionChunk(
        id=_completion_id(turn),
        created=turn.created,
        model=turn.model_name,
        choices=choices,
        usage=usage,
        session_id=turn.session_id,
        message_id=turn.reply_id,
    )


def _completion_id(turn: Turn) -> str:
    return f"chatcmpl-{turn.reply_id}"


def _event(data: str) -> str:
    return f"data: {data}\n\n"
