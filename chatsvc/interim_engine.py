"""Interim EngineClient over transformers' generate, serving the chat until the native engine lands."""

import asyncio
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, StoppingCriteria, TextIteratorStreamer

from engine.model_files import check_model_dir
from engine.outputs import StreamDelta
from engine.protocol import EngineStats
from engine.sampling_params import SamplingParams


class _AbortFlag(StoppingCriteria):
    def __init__(self):
        self.event = threading.Event()

    def __call__(self, input_ids, scores, **kwargs):
        return self.event.is_set()


class InterimEngine:
    def __init__(self, model_dir: Path):
        config = check_model_dir(model_dir)
        self.model_name = Path(model_dir).name
        self.max_model_len = config.get("max_position_embeddings", 2048)
        self._tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        self.lock = threading.Lock()
        self.aborts: dict[str, _AbortFlag] = {}

    @property
    def tokenizer(self):
        return self._tokenizer

    async def generate(
        self, prompt: str | list[int], params: SamplingParams, request_id: str, session_id: str | None = None
    ) -> AsyncIterator[StreamDelta]:
        ids = self._tokenizer.encode(prompt, add_special_tokens=False) if isinstance(prompt, str) else prompt
        if not ids:
            raise ValueError("prompt is empty")
        streamer = TextIteratorStreamer(self._tokenizer, skip_prompt=True, skip_special_tokens=True)
        flag = self.aborts[request_id] = _AbortFlag()
        kwargs = dict(
            input_ids=torch.tensor([ids]),
            max_new_tokens=params.max_tokens,
            do_sample=not params.greedy,
            temperature=params.temperature if not params.greedy else None,
            top_p=params.top_p,
            streamer=streamer,
            stopping_criteria=[flag],
        )
        threading.Thread(target=self._run, kwargs=kwargs, daemon=True).start()
        count = 0
        try:
            while (piece := await asyncio.to_thread(next, streamer, None)) is not None:
                count += 1
                if piece:
                    yield StreamDelta(request_id, piece, [], None, len(ids), 0)
            reason = "abort" if flag.event.is_set() else ("length" if count >= params.max_tokens else "stop")
            yield StreamDelta(request_id, "", [], reason, len(ids), 0)
        finally:
            flag.event.set()
            self.aborts.pop(request_id, None)

    def _run(self, **kwargs):
        with self.lock:
            self.model.generate(**kwargs)

    async def abort(self, request_id: str) -> None:
        if request_id in self.aborts:
            self.aborts[request_id].event.set()

    def stats(self) -> EngineStats:
        return EngineStats()

    def is_healthy(self) -> bool:
        return True

    def shutdown(self) -> None:
        pass
