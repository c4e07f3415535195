"""kvchat: one server for the chat UI, the API and metrics.  python app.py --help lists the settings."""

import sys
import uuid

import gradio as gr
import uvicorn
from fastapi import FastAPI

from chatsvc.interim_engine import InterimEngine
from chatsvc.settings import Settings, settings_from_cli
from engine.model_files import ModelLoadError
from engine.sampling_params import SamplingParams


def build_ui(engine) -> gr.Blocks:
    async def respond(message: str, history: list[dict]):
        messages = [*history, {"role": "user", "content": message}]
        prompt = engine.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        params = SamplingParams(temperature=0, max_tokens=256)
        reply = ""
        async for delta in engine.generate(prompt, params, request_id=uuid.uuid4().hex):
            reply += delta.text
            yield reply

    with gr.Blocks(title="kvchat") as demo:
        gr.ChatInterface(respond, title="kvchat")
    return demo


def build_app(settings: Settings) -> FastAPI:
    engine = InterimEngine(settings.model_path())
    app = FastAPI(title="kvchat")
    return gr.mount_gradio_app(app, build_ui(engine), path="/")


def main() -> None:
    settings = settings_from_cli()
    try:
        app = build_app(settings)
    except ModelLoadError as error:
        sys.exit(f"error: {error}")
    uvicorn.run(app, host=settings.host, port=settings.port)


if __name__ == "__main__":
    main()
