"""The EngineClient over vLLM's async engine, in-process: the same interface as our engine, for GPUs and
clusters (tensor and pipeline parallelism, multi-node with Ray).

Prefix caching and chunked prefill are on, so a session's next turn reuses the cached prefix of its
history while that prefix is still in vLLM's cache.  What only the native engine has (session KV pinned
across turns, attention-based eviction, KV saved to disk) is absent here, and says so: `session_kv` is
False.  vLLM is imported only in this module, and only when this backend is chosen.
"""

from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from engine.outputs import StreamDelta
from engine.protocol import EngineStats
from engine.sampling_params import SamplingParams


@dataclass
class VllmOptions:
    dtype: str = "auto"
    max_model_len: int | None = None
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    distributed_executor_backend: str | None = None  # "mp" or "ray" (several machines)
    gpu_memory_utilization: float = 0.9
    seed: int = 0
    speculative_config: dict | None = None  # e.g. {"method": "ngram", "num_speculative_tokens": 4, ...}


class StatsCollector:
    """Receives vLLM's per-step scheduler and iteration stats (as a stat logger) and keeps EngineStats."""

    def __init__(self):
        self.stats = EngineStats()
        self.ttft: deque[float] = deque(maxlen=1000)
        self.itl: deque[float] = deque(maxlen=5000)

    def logger_factory(self, base):
        collector = self

        class Logger(base):
            def __init__(self, vllm_config, engine_index: int = 0):
                collector.stats.kv_blocks_total = vllm_config.cache_config.num_gpu_blocks or 0

            def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0):
                collector.record(scheduler_stats, iteration_stats)

            def log_engine_initialized(self):
                pass

        return Logger

    def record(self, scheduler, iteration) -> None:
        stats = self.stats
        if scheduler is not None:
            stats.num_running, stats.num_waiting = scheduler.num_running_reqs, scheduler.num_waiting_reqs
            stats.kv_blocks_used = round(scheduler.kv_cache_usage * stats.kv_blocks_total)
            stats.prefix_cache_queries += scheduler.prefix_cache_stats.queries
            stats.prefix_cache_hits += scheduler.prefix_cache_stats.hits
            if scheduler.spec_decoding_stats is not None:
                spec = scheduler.spec_decoding_stats
                stats.spec_num_drafts += spec.num_drafts
                stats.spec_draft_tokens += spec.num_draft_tokens
                stats.spec_accepted_tokens += spec.num_accepted_tokens
        if iteration is not None:
            stats.generation_tokens_total += iteration.num_generation_tokens
            stats.prompt_tokens_total += iteration.num_prompt_tokens
            stats.num_preemptions += iteration.num_preempted_reqs
            self.ttft.extend(iteration.time_to_first_tokens_iter)
            self.itl.extend(iteration.inter_token_latencies_iter)

    def snapshot(self) -> EngineStats:
        return EngineStats(
            **{**vars(self.stats), "ttft_seconds": list(self.ttft), "itl_seconds": list(self.itl)}
        )


class VllmEngine:
    session_kv = False  # sessions reuse vLLM's prefix cache only

    def __init__(self, model: str | Path, options: VllmOptions):
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM
        from vllm.v1.metrics.loggers import StatLoggerBase

        args = AsyncEngineArgs(
            model=str(model),
            dtype=options.dtype,
            max_model_len=options.max_model_len,
            seed=options.seed,
            enable_prefix_caching=True,
            enable_chunked_prefill=True,
            tensor_parallel_size=options.tensor_parallel_size,
            pipeline_parallel_size=options.pipeline_parallel_size,
            distributed_executor_backend=options.distributed_executor_backend,
            gpu_memory_utilization=options.gpu_memory_utilization,
            speculative_config=options.speculative_config,
        )
        self.collector = StatsCollector()
        if options.speculative_config:
            self.collector.stats.speculative = options.speculative_config["method"]
        self.llm = AsyncLLM.from_engine_args(
            args, stat_loggers=[self.collector.logger_factory(StatLoggerBase)]
        )
        self.model_name = Path(model).name
        self.max_model_len = self.llm.model_config.max_model_len

    @property
    def tokenizer(self):
        return self.llm.tokenizer

    async def generate(
        self, prompt: str | list[int], params: SamplingParams, request_id: str, session_id: str | None = None
    ) -> AsyncIterator[StreamDelta]:
        from vllm.inputs import TokensPrompt

        vllm_prompt = prompt if isinstance(prompt, str) else TokensPrompt(prompt_token_ids=list(prompt))
        async for output in self.llm.generate(vllm_prompt, self.sampling(params), request_id):
            completion = output.outputs[0]
            yield StreamDelta(
                request_id=request_id,
                text=completion.text,
                token_ids=list(completion.token_ids),
                finish_reason=completion.finish_reason if output.finished else None,
                num_prompt_tokens=len(output.prompt_token_ids or []),
                num_cached_tokens=output.num_cached_tokens or 0,
            )

    @staticmethod
    def sampling(params: SamplingParams):
        from vllm import SamplingParams as VllmSamplingParams
        from vllm.sampling_params import RequestOutputKind

        return VllmSamplingParams(
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k or -1,
            repetition_penalty=params.repetition_penalty,
            seed=params.seed,
            max_tokens=params.max_tokens,
            stop=params.stop or None,
            stop_token_ids=params.stop_token_ids or None,
            ignore_eos=params.ignore_eos,
            skip_special_tokens=params.skip_special_tokens,
            output_kind=RequestOutputKind.DELTA,
        )

    async def abort(self, request_id: str) -> None:
        await self.llm.abort(request_id)

    def stats(self) -> EngineStats:
        return self.collector.snapshot()

    def is_healthy(self) -> bool:
        return not self.llm.errored

    def shutdown(self) -> None:
        self.llm.shutdown()
