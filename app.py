"""kvchat: one server for the chat UI, the API and metrics.  python app.py --help lists the settings."""

import sys

import gradio as gr
import uvicorn
from fastapi import FastAPI

from chatsvc.hf_chat import HFChat
from chatsvc.settings import Settings, settings_from_cli
from engine.model_files import ModelLoadError


def build_ui(chat: HFChat) -> gr.Blocks:
    def respond(message: str, history: list[dict]):
        yield from chat.stream_reply([*history, {"role": "user", "content": message}])

    with gr.Blocks(title="kvchat") as demo:
        gr.ChatInterface(respond, title="kvchat")
    return demo


def build_app(settings: Settings) -> FastAPI:
    chat = HFChat(settings.model_path())
    app = FastAPI(title="kvchat")
    return gr.mount_gradio_app(app, build_ui(chat), path="/")


def main() -> None:
    settings = settings_from_cli()
    try:
        app = build_app(settings)
    except ModelLoadError as error:
        sys.exit(f"error: {error}")
    uvicorn.run(app, host=settings.host, port=settings.port)


if __name__ == "__main__":
    main()
