"""Request dependencies: the service, and the caller behind the request's API key."""

from typing import Annotated

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from chatsvc.models import User
from chatsvc.service import ChatService


def get_service(request: Request) -> ChatService:
    return request.app.state.service


ServiceDep = Annotated[ChatService, Depends(get_service)]
bearer = HTTPBearer(auto_error=False, description="an API key: Authorization: Bearer kvc-...")


async def current_user(
    service: ServiceDep, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]
) -> User:
    user = await service.accounts.user_for_api_key(credentials.credentials) if credentials else None
    if user is None:
        reason = "invalid API key" if credentials else "missing API key"
        raise HTTPException(
            401, f"{reason}: send Authorization: Bearer <key>", {"WWW-Authenticate": "Bearer"}
        )
    return user


CurrentUser = Annotated[User, Depends(current_user)]
