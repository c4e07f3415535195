"""One runner per engine under test, behind the same two calls: `offline(requests)` (all at once) and
`stream(request)` (one request through the engine's streaming interface, timed per token).  Each builds its
engine on the first call and keeps it, so a warm-up through the same call leaves the timed calls nothing
to build (bench/throughput.py warms every engine up before its clock starts).

Imports are lazy: the vLLM runner runs in vLLM's own virtual environment, where our engine's
dependencies are not installed, and each runner's process loads only its own engine.
"""

import asyncio
import itertools
import time
from dataclasses import dataclass

from bench.workloads import Request


@dataclass
class Timing:
    arrival: float
    first_token: float
    finish: float
    tokens: int
    kind: str = ""


class OursRunner:
    quantization: str | None = None
    kv_cache_dtype = "auto"

    def __init__(self, model: str, dtype: str, policy: str = "fcfs", max_num_seqs: int = 64):
        from engine.config import EngineConfig

        self.config = EngineConfig(
            model=model,
            dtype=dtype,
            scheduling_policy=policy,
            max_num_seqs=max_num_seqs,
            quantization=self.quantization,
            kv_cache_dtype=self.kv_cache_dtype,
        )
        self.llm = None
        self.engine = None
        self.ids = itertools.count()

    @staticmethod
    def params(max_tokens: int):
        from engine.sampling_params import SamplingParams

        return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)

    def offline(self, requests: list[Request]) -> int:
        from engine.llm import LLM

        self.llm = self.llm or LLM(**vars(self.config))
        outputs = self.llm.generate(
            [{"prompt_token_ids": r.prompt_token_ids} for r in requests],
            [self.params(r.max_tokens) for r in requests],
        )
        return sum(len(o.outputs[0].token_ids) for o in outputs)

    async def stream(self, request: Request) -> tuple[float, int]:
        from engine.async_engine import AsyncEngine

        if self.engine is None:
            self.engine = AsyncEngine(self.config)
        first, count = None, 0
        prompt = {"prompt_token_ids": request.prompt_token_ids}
        async for delta in self.engine.generate(prompt, self.params(request.max_tokens), str(next(self.ids))):
            first = first or time.perf_counter()
            count += len(delta.token_ids)
        return first, count

    def close(self) -> None:
        if self.engine is not None:
            self.engine.shutdown()


class VllmRunner:
    def __init__(self, model: str, dtype: str, policy: str = "fcfs", max_num_seqs: int = 64):
        from vllm import SamplingParams
        from vllm.engine.arg_utils import AsyncEngineArgs

        self.args = dict(
            model=model,
            dtype=dtype,
            enable_prefix_caching=True,
            max_model_len=4096,
            seed=0,
            max_num_seqs=max_num_seqs,
        )
        self.sampling = SamplingParams
        self.engine_args = AsyncEngineArgs(**self.args)
        self.llm = None
        self.engine = None
        self.ids = itertools.count()

    def params(self, max_tokens: int):
        return self.sampling(temperature=0, max_tokens=max_tokens, ignore_eos=True)

    def offline(self, requests: list[Request]) -> int:
        from vllm import LLM
        from vllm.inputs import TokensPrompt

        self.llm = self.llm or LLM(**self.args)
        prompts = [TokensPrompt(prompt_token_ids=r.prompt_token_ids) for r in requests]
        outputs = self.llm.generate(prompts, [self.params(r.max_tokens) for r in requests], use_tqdm=False)
        return sum(len(o.outputs[0].token_ids) for o in outputs)

    async def stream(self, request: Request) -> tuple[float, int]:
        from vllm.inputs import TokensPrompt
        from vllm.v1.engine.async_llm import AsyncLLM

        if self.engine is None:
            self.engine = AsyncLLM.from_engine_args(self.engine_args)
        first, count = None, 0
        prompt = TokensPrompt(prompt_token_ids=request.prompt_token_ids)
        async for output in self.engine.generate(
            prompt, self.params(request.max_tokens), str(next(self.ids))
        ):
            first = first or time.perf_counter()
            count = len(output.outputs[0].token_ids)
        return first, count

    def close(self) -> None:
        if self.engine is not None:
            self.engine.shutdown()


class TransformersRunner:
    """transformers' generate: batched and left-padded offline; one request at a time when streaming."""

    def __init__(self, model: str, dtype: str, policy: str = "fcfs", max_num_seqs: int = 64):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch = torch
        self.device = "cuda" if torch.cuda.is_available() else "cpu"  # where our engine runs too
        self.tokenizer = AutoTokenizer.from_pretrained(model, padding_side="left")
        self.model = AutoModelForCausalLM.from_pretrained(model, dtype=getattr(torch, dtype)).to(self.device)
        self.lock = asyncio.Lock()

    def generate(self, requests: list[Request], streamer=None):
        width = max(len(r.prompt_token_ids) for r in requests)
        pad = self.tokenizer.pad_token_id or 0
        ids = [[pad] * (width - len(r.prompt_token_ids)) + r.prompt_token_ids for r in requests]
        mask = [[0] * (width - len(r.prompt_token_ids)) + [1] * len(r.prompt_token_ids) for r in requests]
        new = max(r.max_tokens for r in requests)
        with self.torch.inference_mode():
            out = self.model.generate(
                input_ids=self.torch.tensor(ids, device=self.device),
                attention_mask=self.torch.tensor(mask, device=self.device),
                do_sample=False,
                max_new_tokens=new,
                min_new_tokens=new,
                pad_token_id=pad,
                streamer=streamer,
            )
        return out[:, width:]

    def offline(self, requests: list[Request]) -> int:
        return self.generate(requests).numel()

    async def stream(self, request: Request) -> tuple[float, int]:
        from transformers.generation.streamers import BaseStreamer

        class FirstToken(BaseStreamer):
            calls, first = 0, None

            def put(self, value):
                self.calls += 1
                if self.calls == 2:  # the first call carries the prompt
                    self.first = time.perf_counter()

            def end(self):
                pass

        streamer = FirstToken()
        async with self.lock:  # generate serves one request at a time
            out = await asyncio.to_thread(self.generate, [request], streamer)
        return streamer.first, out.shape[1]

    def close(self) -> None:
        pass


class OursInt8Runner(OursRunner):
    quantization = "int8"


class OursInt8KvRunner(OursRunner):
    kv_cache_dtype = "int8"


class OursInt8BothRunner(OursRunner):
    quantization, kv_cache_dtype = "int8", "int8"


RUNNERS = {
    "ours": OursRunner,
    "ours_int8": OursInt8Runner,
    "ours_int8kv": OursInt8KvRunner,
    "ours_int8_int8kv": OursInt8BothRunner,
    "vllm": VllmRunner,
    "transformers": TransformersRunner,
}


async def replay(runner, requests: list[Request]) -> list[Timing]:
    """Submit each request at its arrival time; time its first token and its end."""
    start = time.perf_counter()

    async def one(request: Request) -> Timing:
        await asyncio.sleep(max(0.0, start + request.arrival - time.perf_counter()))
        submitted = time.perf_counter()
        first, tokens = await runner.stream(request)
        return Timing(submitted - start, first - start, time.perf_counter() - start, tokens, request.kind)

    return await asyncio.gather(*(one(request) for request in requests))
