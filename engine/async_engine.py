"""The streaming engine for servers: the step loop runs in a background thread; asyncio callers add
requests, iterate their deltas and abort them.

The engine itself is single-threaded: every change to it (add, abort) travels as a command that the loop
thread runs between steps, and deltas travel back through each caller's asyncio queue.
"""

import asyncio
import concurrent.futures
import logging
import queue
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TypeVar

import torch

from engine.config import EngineConfig
from engine.llm_engine import LLMEngine, Prompt, StepUpdate
from engine.outputs import StreamDelta
from engine.protocol import EngineStats
from engine.sampling_params import SamplingParams
from engine.session_kv import SessionCache
from engine.threads import use_default_threads

log = logging.getLogger(__name__)
T = TypeVar("T")


class EngineDeadError(RuntimeError):
    pass


class AsyncEngine:
    def __init__(self, config: EngineConfig):
        self.commands: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self.streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self.wakeup = threading.Event()
        self.stopping = False
        self.error: BaseException | None = None
        # The engine is built on the loop thread too: once a second thread of the process has run torch's
        # parallel (OpenMP) ops, this thread's decode steps slow down (41 ms instead of 24, measured on
        # 2 cores), and loading the model is such work.  Other threads doing it still cost the same.
        built: concurrent.futures.Future[LLMEngine] = concurrent.futures.Future()
        self.thread = threading.Thread(
            target=self.loop, args=(config, built), name="engine-loop", daemon=True
        )
        self.thread.start()
        self.engine = built.result()  # a model that cannot load raises here
        self.model_name = Path(config.model).name
        self.max_model_len = self.engine.max_model_len

    @property
    def session_kv(self) -> SessionCache:
        """The sessions' KV in the pool; touch it only through call / call_sync (the engine thread's)."""
        return self.engine.session_kv

    @property
    def kv_identity(self) -> tuple[str, torch.dtype]:
        """The model's fingerprint (weights, quantization, compute dtype) and the dtype the KV cache stores:
        KV saved under another identity cannot be used."""
        return self.engine.fingerprint, self.engine.kv_dtype

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    async def generate(
        self, prompt: Prompt, params: SamplingParams, request_id: str, session_id: str | None = None
    ) -> AsyncIterator[StreamDelta]:
        deltas: asyncio.Queue[StreamDelta | BaseException] = asyncio.Queue()
        loop = asyncio.get_running_loop()

        def add() -> None:
            self.engine.add_request(request_id, prompt, params, session_id)
            self.streams[request_id] = (loop, deltas)

        try:
            await self.call(add)
        except asyncio.CancelledError:  # the caller left while the request was being added
            self.submit(lambda: self.abort_now(request_id, missing_ok=True))
            raise
        finished = False
        try:
            while not finished:
                delta = await deltas.get()
                if isinstance(delta, BaseException):
                    raise delta
                finished = delta.finish_reason is not None
                yield delta
        finally:
            if not finished:
                self.submit(lambda: self.abort_now(request_id, missing_ok=True))

    async def abort(self, request_id: str) -> None:
        await self.call(lambda: self.abort_now(request_id))

    def abort_now(self, request_id: str, missing_ok: bool = False) -> None:
        if missing_ok and request_id not in self.engine.sequences:
            self.streams.pop(request_id, None)
            return
        seq = self.engine.abort_request(request_id)
        self.publish(StepUpdate(seq, [], "", finished=True))

    def stats(self) -> EngineStats:
        return self.engine.stats()

    def is_healthy(self) -> bool:
        return self.error is None and self.thread.is_alive()

    def shutdown(self) -> None:
        self.stopping = True
        self.wakeup.set()
        self.thread.join(timeout=30)

    async def call(self, command: Callable[[], T]) -> T:
        """Run a command on the loop thread and wait for its result; its exception is raised here."""
        return await asyncio.wrap_future(self.schedule(command))

    def call_sync(self, command: Callable[[], T], timeout: float | None = None) -> T:
        """The same, for plain threads."""
        return self.schedule(command).result(timeout)

    def schedule(self, command: Callable[[], T]) -> concurrent.futures.Future:
        done: concurrent.futures.Future = concurrent.futures.Future()

        def run() -> None:
            if not done.set_running_or_notify_cancel():
                return  # the caller is gone
            try:
                done.set_result(command())
            except Exception as error:
                done.set_exception(error)

        self.submit(run)
        return done

    def submit(self, command: Callable[[], None]) -> None:
        if not self.is_healthy():
            raise EngineDeadError(f"the engine stopped: {self.error!r}")
        self.commands.put(command)
        self.wakeup.set()

    def loop(self, config: EngineConfig, built: concurrent.futures.Future) -> None:
        use_default_threads()  # whatever helper threads did to torch's default first (engine/threads.py)
        try:
            self.engine = LLMEngine(config)
        except BaseException as error:
            built.set_exception(error)
            return
        built.set_result(self.engine)
        try:
            while not self.stopping:
                self.run_commands()
                if not self.engine.has_unfinished_requests():
                    self.wakeup.wait()
                    self.wakeup.clear()
                    continue
                for update in self.engine.step():
                    self.publish(update)
        except BaseException as error:
            log.exception("engine loop died")
            self.error = error
            self.fail_all(EngineDeadError(f"the engine stopped: {error!r}"))

    def run_commands(self) -> None:
        while True:
            try:
                command = self.commands.get_nowait()
            except queue.Empty:
                return
            try:
                command()
            except Exception:  # a bad command fails alone; only a failed step stops the engine
                log.exception("engine command failed")

    def publish(self, update: StepUpdate) -> None:
        seq = update.seq
        target = self.streams.get(seq.request_id)
        if target is None:
            return
        if update.finished:
            del self.streams[seq.request_id]
        delta = StreamDelta(
            request_id=seq.request_id,
            text=update.new_text,
            token_ids=update.new_token_ids,
            finish_reason=seq.finish_reason if update.finished else None,
            num_prompt_tokens=seq.num_prompt_tokens,
            num_cached_tokens=max(seq.num_cached_tokens, 0),
            num_draft_tokens=seq.draft.drafted if seq.draft else 0,
            num_accepted_tokens=seq.draft.accepted if seq.draft else 0,
        )
        if not deliver(target, delta) and not update.finished:
            self.streams.pop(seq.request_id, None)
            self.submit(lambda: self.abort_now(seq.request_id, missing_ok=True))

    def fail_all(self, error: BaseException) -> None:
        for target in self.streams.values():
            deliver(target, error)
        self.streams.clear()


def deliver(target: tuple[asyncio.AbstractEventLoop, asyncio.Queue], item) -> bool:
    """Hand an item to the caller's event loop; False when that loop has closed (nobody is listening)."""
    loop, deltas = target
    try:
        loop.call_soon_threadsafe(deltas.put_nowait, item)
    except RuntimeError:
        return False
    return True
