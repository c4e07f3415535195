"""Interim EngineClient over transformers' generate, serving the chat until the native engine lands.

One request generates at a time (the others wait their turn); no batching, no KV reuse."""

import asyncio
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, StoppingCriteria
from transformers.generation.streamers import BaseStreamer

from engine.model_files import check_model_dir
from engine.outputs import StreamDelta
from engine.protocol import EngineStats
from engine.sampling_params import SamplingParams

_END = object()


class _Request(StoppingCriteria, BaseStreamer):
    """Carries one request's new token ids from the generating thread to its asyncio consumer."""

    def __init__(self, loop: asyncio.AbstractEventLoop, stats: EngineStats):
        self.loop = loop
        self.stats = stats
        self.queue: asyncio.Queue = asyncio.Queue()
        self.stop_event = threading.Event()
        self.prompt_seen = False

    def __call__(self, input_ids, scores, **kwargs):  # StoppingCriteria
        return self.stop_event.is_set()

    def put(self, value):  # BaseStreamer: the prompt first, then each step's new token
        if self.prompt_seen:
            self.stats.generation_tokens_total += value.numel()
            self.send(value.reshape(-1).tolist())
        self.prompt_seen = True

    def end(self):
        pass  # the thread sends _END itself, also when generate fails

    def send(self, item) -> None:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:  # the event loop is closed: nobody is listening any more
            self.stop_event.set()


class InterimEngine:
    def __init__(self, model_dir: Path):
        config = check_model_dir(model_dir)
        self.model_name = Path(model_dir).name
        self.max_model_len = config.get("max_position_embeddings", 2048)
        self._tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        eos = self.model.generation_config.eos_token_id
        self.eos_token_ids = set(eos if isinstance(eos, list) else [eos])
        self.lock = threading.Lock()
        self.requests: dict[str, _Request] = {}
        self._stats = EngineStats()

    @property
    def tokenizer(self):
        return self._tokenizer

    async def generate(
        self, prompt: str | list[int], params: SamplingParams, request_id: str, session_id: str | None = None
    ) -> AsyncIterator[StreamDelta]:
        ids = self._tokenizer.encode(prompt, add_special_tokens=False) if isinstance(prompt, str) else prompt
        if not ids:
            raise ValueError("prompt is empty")
        if len(ids) >= self.max_model_len:
            raise ValueError(f"prompt is {len(ids)} tokens; the model's context is {self.max_model_len}")
        request = self.requests[request_id] = _Request(asyncio.get_running_loop(), self._stats)
        max_new_tokens = min(params.max_tokens, self.max_model_len - len(ids))
        self._stats.num_waiting += 1
        threading.Thread(target=self._run, args=(request, ids, params, max_new_tokens), daemon=True).start()
        decoder = _StopAwareDecoder(self._tokenizer, params)
        unsent_ids: list[int] = []
        try:
            while not decoder.stopped and (item := await request.queue.get()) is not _END:
                if isinstance(item, Exception):
                    raise item
                unsent_ids += item
                if text := decoder.add(item):
                    yield StreamDelta(request_id, text, unsent_ids, None, len(ids), 0)
                    unsent_ids = []
            reason = self._finish_reason(request, decoder, max_new_tokens)
            yield StreamDelta(request_id, decoder.flush(), unsent_ids, reason, len(ids), 0)
        finally:
            request.stop_event.set()
            self.requests.pop(request_id, None)

    def _finish_reason(self, request: _Request, decoder: "_StopAwareDecoder", max_new_tokens: int) -> str:
        if decoder.stopped or (decoder.ids and decoder.ids[-1] in self.eos_token_ids):
            return "stop"
        if request.stop_event.is_set():
            return "abort"
        return "length" if len(decoder.ids) >= max_new_tokens else "stop"

    def _run(self, request: _Request, ids: list[int], params: SamplingParams, max_new_tokens: int) -> None:
        try:
            with self.lock:
                self._stats.num_waiting -= 1
                if request.stop_event.is_set():  # aborted while it waited
                    return
                self._stats.num_running += 1
                self._stats.prompt_tokens_total += len(ids)
                try:
                    if params.seed is not None:
                        torch.manual_seed(params.seed)
                    self.model.generate(**self._generate_kwargs(request, ids, params, max_new_tokens))
                finally:
                    self._stats.num_running -= 1
        except Exception as error:
            request.send(error)
        finally:
            request.send(_END)

    def _generate_kwargs(
        self, request: _Request, ids: list[int], params: SamplingParams, max_new_tokens: int
    ):
        sampling = {"do_sample": False}
        if not params.greedy:
            top_k = params.top_k if params.top_k > 0 else 0  # 0 disables transformers' default top_k=50
            sampling = {
                "do_sample": True,
                "temperature": params.temperature,
                "top_p": params.top_p,
                "top_k": top_k,
            }
        return dict(
            input_ids=torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            max_new_tokens=max_new_tokens,
            repetition_penalty=params.repetition_penalty,
            streamer=request,
            stopping_criteria=[request],
            **sampling,
        )

    async def abort(self, request_id: str) -> None:
        if request_id in self.requests:
            self.requests[request_id].stop_event.set()

    def stats(self) -> EngineStats:
        return EngineStats(**vars(self._stats))

    def is_healthy(self) -> bool:
        return True

    def shutdown(self) -> None:
        for request in list(self.requests.values()):
            request.stop_event.set()


class _StopAwareDecoder:
    """Turns token ids into text pieces: never half a UTF-8 character, never text past a stop string."""

    def __init__(self, tokenizer, params: SamplingParams):
        self.tokenizer = tokenizer
        self.params = params
        self.ids: list[int] = []
        self.emitted = ""
        self.stopped = False
        self.holdback = max((len(stop) for stop in params.stop), default=1) - 1

    def add(self, new_ids: list[int]) -> str:
        self.ids.extend(new_ids)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=self.params.skip_special_tokens)
        for stop in self.params.stop:
            if (at := text.find(stop)) >= 0:
                self.stopped = True
                text = text[:at]
        if text.endswith("\ufffd") and not self.stopped:
            return ""  # half a character: wait for the rest
        ready = text if self.stopped else text[: max(len(self.emitted), len(text) - self.holdback)]
        piece, self.emitted = ready[len(self.emitted) :], ready
        return piece

    def flush(self) -> str:
        if self.stopped:
            return ""
        text = self.tokenizer.decode(self.ids, skip_special_tokens=self.params.skip_special_tokens)
        piece, self.emitted = text[len(self.emitted) :], text
        return piece
