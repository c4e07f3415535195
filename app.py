"""kvchat: one server for the chat UI, the API and metrics.  python app.py --help lists the settings."""

import sys

import gradio as gr
import uvicorn
from fastapi import FastAPI
from sqlalchemy.exc import SQLAlchemyError

from chatsvc.api.main import create_api
from chatsvc.db import redacted
from chatsvc.errors import EngineUnavailable, QueueFull
from chatsvc.models import User
from chatsvc.service import ChatService
from chatsvc.settings import Settings, settings_from_cli
from chatsvc.turns import TurnOptions
from engine.model_files import ModelLoadError

UI_OPTIONS = TurnOptions(max_tokens=256, temperature=0)


def build_ui(service: ChatService, user: User) -> gr.Blocks:
    """The minimal chat page; its chats are stored sessions of `user` (logins come with the full UI)."""

    async def respond(message: str, history: list[dict], session_id: str | None):
        try:
            if history and session_id:
                turn = await service.send(user, session_id, message, UI_OPTIONS)
            else:
                turn = await service.start_session(user, message, UI_OPTIONS)
        except (ValueError, LookupError, QueueFull, EngineUnavailable) as error:
            raise gr.Error(str(error)) from None
        reply = ""
        try:
            async for piece in turn.stream():
                reply += piece
                yield reply, turn.session_id
        finally:
            turn.cancel()  # the user pressed stop or left: the reply is stored as aborted
        if (result := await turn.result()).error:
            raise gr.Error(str(result.error))

    with gr.Blocks(title="kvchat") as demo:
        session_id = gr.State(None)
        gr.ChatInterface(
            respond, title="kvchat", additional_inputs=[session_id], additional_outputs=[session_id]
        )
    return demo


def build_app(settings: Settings) -> FastAPI:
    """The whole server (API, metrics, UI at /); raises ModelLoadError or SQLAlchemyError on bad settings."""
    app = create_api(settings)
    return gr.mount_gradio_app(app, build_ui(app.state.service, app.state.first_admin), path="/")


def main() -> None:
    settings = settings_from_cli()
    try:
        app = build_app(settings)
    except ModelLoadError as error:
        sys.exit(f"error: {error}")
    except SQLAlchemyError as error:
        reason = str(error).splitlines()[0]
        sys.exit(f"error: cannot use the database {redacted(settings.database_url())}: {reason}")
    uvicorn.run(app, host=settings.host, port=settings.port)


if __name__ == "__main__":
    main()
