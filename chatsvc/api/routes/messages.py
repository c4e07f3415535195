"""One message: read it (also while it streams), regenerate a reply, edit a user message (a new branch)."""

from fastapi import APIRouter, Request

from chatsvc.api.deps import CurrentUser, ServiceDep
from chatsvc.api.routes.chat import until_done
from chatsvc.api.schemas import EditRequest, GenerationOptions, Id, MessagePublic, TurnPublic
from chatsvc.models import User
from chatsvc.service import ChatService
from chatsvc.turns import Turn

router = APIRouter(prefix="/api/messages", tags=["messages"])


@router.get("/{message_id}", response_model=MessagePublic)
async def read_message(message_id: Id, user: CurrentUser, service: ServiceDep):
    return await service.chat_sessions.message(user, message_id)


@router.post("/{message_id}/regenerate", response_model=TurnPublic)
async def regenerate(
    message_id: Id, body: GenerationOptions, user: CurrentUser, service: ServiceDep, request: Request
) -> TurnPublic:
    """Another reply to the same user message (a new branch); answers when it has finished."""
    turn = await service.turns.regenerate(user, message_id, body.turn_options())
    return await _finished(turn, user, service, request)


@router.post("/{message_id}/edit", response_model=TurnPublic)
async def edit(message_id: Id, body: EditRequest, user: CurrentUser, service: ServiceDep, request: Request):
    """A new user message beside this one (a new branch) and its reply; answers when it has finished."""
    turn = await service.turns.edit(user, message_id, body.content, body.turn_options())
    return await _finished(turn, user, service, request)


async def _finished(turn: Turn, user: User, service: ChatService, request: Request) -> TurnPublic:
    result = await until_done(turn, request)
    if result.error is not None:
        raise result.error
    reply = MessagePublic.model_validate(await service.chat_sessions.message(user, turn.reply_id))
    return TurnPublic(session_id=turn.session_id, reply=reply)
