"""Who is calling: the password check Gradio's login page runs, and the user behind every event."""

import functools
import inspect

import gradio as gr

from chatsvc.errors import EngineUnavailable, NotAvailable, QueueFull
from chatsvc.models import Role, User
from chatsvc.service import ChatService

# Refusals and caller mistakes the service explains in words; anything else stays a server-side error.
SHOWN_ERRORS = (ValueError, LookupError, PermissionError, QueueFull, EngineUnavailable, NotAvailable)


class Identity:
    """Gradio keeps the login token -> username; this maps the username to the service's user."""

    def __init__(self, service: ChatService):
        self.service = service
        self.logged_in: dict[str, User] = {}  # filled at login; Gradio's tokens die with the process too

    async def login(self, username: str, password: str) -> bool:
        user = await self.service.authenticate(username, password)
        if user is not None:
            self.logged_in[user.username] = user
        return user is not None

    def user(self, request: gr.Request) -> User:
        user = self.logged_in.get(request.username or "")
        if user is None:
            raise gr.Error("You are not logged in; reload the page to log in.")
        return user

    def admin(self, request: gr.Request) -> User:
        user = self.user(request)
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
