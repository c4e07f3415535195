"""kvchat: one server for the chat UI, the API and metrics.  python app.py --help lists the settings."""

import gc
import os
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
from chatsvc.ui.content_policy import ContentSecurityPolicy, content_security_policy
from chatsvc.ui.identity import Identity
from chatsvc.ui.knowledge_page import KnowledgePage
from chatsvc.ui.login import LoginGate, login_routes
from chatsvc.ui.stale_events import unknown_event
from chatsvc.ui.theme import theme
from chatsvc.ui.uploads import RecordUploads, UploadLedger

STATIC_DIR = Path(__file__).resolve().parent / "static"
STATIC_URL = "/kvchat-static"  # Gradio serves its own files under /static
LOGIN_MESSAGE = (
    "Log in with your kvchat account. The first admin is 'admin': the first start shows its password "
    "(or writes it to first-admin.txt in the data folder)."
)
OTHER_PAGES = (("Knowledge bases", "/knowledge", KnowledgePage), ("Admin", "/admin", AdminPage))


def build_ui(service: ChatService, identity: Identity, remote_images: bool) -> gr.Blocks:
    """The pages, one module each; every handler knows its user from the login.  Pages are built before
    they are placed: a Blocks made inside another one would be laid out twice."""
    chat = ChatPage.blocks(service, identity, remote_images=remote_images)
    pages = [(name, path, page.blocks(service, identity)) for name, path, page in OTHER_PAGES]
    with gr.Blocks(title="kvchat") as ui:
        gr.Navbar(main_page_name="Chat")
        chat.render()
    for name, path, page in pages:
        with ui.route(name, path):
            gr.Navbar(main_page_name="Chat")
            page.render()
    return ui


def build_app(settings: Settings) -> FastAPI:
    """The whole server (API, metrics, login, UI at /); raises ModelLoadError, ValueError or SQLAlchemyError
    on bad settings."""
    app = create_api(settings)
    app.mount(STATIC_URL, StaticFiles(directory=STATIC_DIR), name="kvchat-static")
    uploads = _private_folder(settings.data_path() / "uploads")
    # Read by Gradio as it builds the UI: its upload folder and cache, and no telemetry to Gradio's servers.
    os.environ.update(GRADIO_TEMP_DIR=str(uploads), GRADIO_ANALYTICS_ENABLED="False")
    identity = Identity(app.state.service.accounts.logins, UploadLedger(uploads))
    app.include_router(login_routes(identity, LOGIN_MESSAGE))
    app.add_middleware(LoginGate, identity=identity, pages=["/", *(path for _, path, _ in OTHER_PAGES)])
    app.add_middleware(RecordUploads, ledger=identity.uploads, login_id=identity.login_id)
    # Added last, so outermost: every response carries it, the login gate's too.
    app.add_middleware(ContentSecurityPolicy, policy=content_security_policy(settings.allow_remote_images))
    return gr.mount_gradio_app(
        app,
        build_ui(app.state.service, identity, settings.allow_remote_images),
        path="/",
        auth_dependency=identity.login_id,
        show_error=False,
        footer_links=[],
        theme=theme(),
        css_paths=[STATIC_DIR / "kvchat.css"],
        head_paths=[STATIC_DIR / "head.html"],
        favicon_path=STATIC_DIR / "favicon.svg",
        max_file_size=settings.max_file_bytes,
        app_kwargs={"exception_handlers": {KeyError: unknown_event}},
    )


def _private_folder(path: Path) -> Path:
    """Gradio's upload cache: files users upload, readable by the server's user only."""
    path.mkdir(mode=0o700, exist_ok=True)
    path.chmod(0o700)
    return path


def main() -> None:
    settings = settings_from_cli()
    try:
        app = build_app(settings)
    except ValueError as error:  # ModelLoadError is one
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
