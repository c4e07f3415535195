"""Interim reply streaming over transformers' generate, until the engine serves the chat."""

from collections.abc import Iterator
from pathlib import Path
from threading import Thread

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, TextIteratorStreamer

from engine.model_files import check_model_dir


class HFChat:
    def __init__(self, model_dir: Path, dtype: torch.dtype = torch.float32):
        check_model_dir(model_dir)
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)

    def stream_reply(self, messages: list[dict], max_new_tokens: int = 256) -> Iterator[str]:
        """Yield the reply so far, growing, for a list of {"role", "content"} messages."""
        inputs = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
        )
        streamer = TextIteratorStreamer(self.tokenizer, skip_prompt=True, skip_special_tokens=True)
        kwargs = dict(**inputs, max_new_tokens=max_new_tokens, do_sample=False, streamer=streamer)
        Thread(target=self.model.generate, kwargs=kwargs, daemon=True).start()
        reply = ""
        for piece in streamer:
            reply += piece
            yield reply
