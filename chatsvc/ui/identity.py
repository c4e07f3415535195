"""Who is calling: the login behind a request (its cookie), and the user behind every UI event, looked up
in the database each time, so that a deleted or disabled user, or an ended login, loses access at once."""

import functools
import inspect

import gradio as gr
from fastapi import Request

from chatsvc.errors import EngineUnavailable, NotAvailable, QueueFull
from chatsvc.logins import Logins
from chatsvc.models import Role, User
from chatsvc.ui.uploads import UploadLedger

# Refusals and caller mistakes the service explains in words; anything else stays a server-side error.
SHOWN_ERRORS = (ValueError, LookupError, PermissionError, QueueFull, EngineUnavailable, NotAvailable)
LOGIN_COOKIE = "kvchat-login"


class Identity:
    def __init__(self, logins: Logins, uploads: UploadLedger):
        self.logins = logins
        self.uploads = uploads  # which login uploaded which file

    async def login_id(self, request: Request) -> str | None:
        """Gradio's auth_dependency, run for every request to the UI: what its events see as the username."""
        token = request.cookies.get(LOGIN_COOKIE)
        return await self.logins.login_id(token) if token else None

    async def user(self, request: gr.Request) -> User:
        user = await self.logins.user(request.username) if request.username else None
        if user is None:
            raise gr.Error("You are not logged in any more; reload the page to log in.")
        return user

    async def admin(self, request: gr.Request) -> User:
        user = await self.user(request)
        if user.role != Role.admin:
            raise gr.Error("This page is for admins.")
        return user


def shows_errors(handler):
    """Turns the service's explained refusals into messages on the page (async functions and generators)."""
    if inspect.isasyncgenfunction(handler):

        @functools.wraps(handler)
        async def stream(*args, **kwargs):
            try:
                async for update in handler(*args, **kwargs):
                    yield update
            except gr.Error:
                raise
            except SHOWN_ERRORS as error:
                raise gr.Error(str(error)) from None

        return stream

    @functools.wraps(handler)
    async def call(*args, **kwargs):
        try:
            return await handler(*args, **kwargs)
        except gr.Error:
            raise
        except SHOWN_ERRORS as error:
            raise gr.Error(str(error)) from None

    return call
