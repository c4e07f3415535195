"""kvchat: one server for the chat UI, the API and metrics.  python app.py --help lists the settings."""

import gc
import sys
from pathlib import Path

import gradio as gr
import uvicorn
from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles
from sqlalchemy.exc import SQLAlchemyError

from chatsvc.api.main import create_api
from chatsvc.db import redacted
from chatsvc.service import ChatService
from chatsvc.settings import Settings, settings_from_cli
from chatsvc.ui.admin_page import AdminPage
from chatsvc.ui.chat_page import ChatPage
from chatsvc.ui.identity import Identity
from chatsvc.ui.knowledge_page import KnowledgePage
from chatsvc.ui.theme import theme
from engine.model_files import ModelLoadError

STATIC_DIR = Path(__file__).resolve().parent / "static"
STATIC_URL = "/kvchat-static"  # Gradio serves its own files under /static
LOGIN_MESSAGE = (
    "Log in with your kvchat account. The first admin is 'admin': the first start's log shows its password."
)


def build_ui(service: ChatService, identity: Identity) -> gr.Blocks:
    """The pages, one module each; every handler knows its user from the login.  Pages are built before
    they are placed: a Blocks made inside another one would be laid out twice."""
    chat = ChatPage.blocks(service, identity)
    knowledge = KnowledgePage.blocks(service, identity)
    admin = AdminPage.blocks(service, identity)
    with gr.Blocks(title="kvchat") as ui:
        gr.Navbar(main_page_name="Chat")
        chat.render()
    for name, path, page in (("Knowledge bases", "/knowledge", knowledge), ("Admin", "/admin", admin)):
        with ui.route(name, path):
            gr.Navbar(main_page_name="Chat")
            page.render()
    return ui


def build_app(settings: Settings) -> FastAPI:
    """The whole server (API, metrics, UI at /); raises ModelLoadError or SQLAlchemyError on bad settings."""
    app = create_api(settings)
    app.mount(STATIC_URL, StaticFiles(directory=STATIC_DIR), name="kvchat-static")
    identity = Identity(app.state.service)
    return gr.mount_gradio_app(
        app,
        build_ui(app.state.service, identity),
        path="/",
        auth=identity.login,
        auth_message=LOGIN_MESSAGE,
        show_error=False,
        footer_links=[],
        theme=theme(),
        css_paths=[STATIC_DIR / "kvchat.css"],
        head_paths=[STATIC_DIR / "head.html"],
        favicon_path=STATIC_DIR / "favicon.svg",
        max_file_size=settings.max_file_bytes,
    )


def main() -> None:
    settings = settings_from_cli()
    try:
        app = build_app(settings)
    except ModelLoadError as error:
        sys.exit(f"error: {error}")
    except SQLAlchemyError as error:
        reason = str(error).splitlines()[0]
        sys.exit(f"error: cannot use the database {redacted(settings.database_url())}: {reason}")
    # What is loaded by now (libraries, model, UI) lives as long as the server.  Frozen, it is left out of
    # Python's full collections, which otherwise walk its objects holding the GIL: 200 ms for the engine's
    # ~440,000 alone, a stall in every stream.
    gc.collect()
    gc.freeze()
    uvicorn.run(app, host=settings.host, port=settings.port)


if __name__ == "__main__":
    main()
