"""vLLM's CPU build behind the two calls bench.speculative makes of an engine: `generate` (streaming the
new tokens of each step) and `stats` (drafted and accepted tokens).  It runs in vLLM's own virtual
environment (make vllm-cpu).  vLLM keeps no session KV: a support chat's turns reuse their history through
its prefix cache instead."""

from dataclasses import dataclass
from types import SimpleNamespace

PROMPT_LOOKUP = {"prompt_lookup_min": 2, "prompt_lookup_max": 4}  # ours, bench.speculative's setting


@dataclass
class SpecCounters:
    spec_draft_tokens: int
    spec_accepted_tokens: int


class VllmEngine:
    def __init__(self, model: str, dtype: str, method: str | None, num_speculative_tokens: int):
        from transformers import AutoTokenizer
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        speculative = {"method": method, "num_speculative_tokens": num_speculative_tokens, **PROMPT_LOOKUP}
        args = AsyncEngineArgs(
            model=model,
            dtype=dtype,
            enable_prefix_caching=True,
            max_model_len=4096,
            max_num_seqs=64,
            seed=0,
            speculative_config=speculative if method else None,
        )
        self.engine = AsyncLLM.from_engine_args(args)
        self.tokenizer = AutoTokenizer.from_pretrained(model)

    async def generate(self, prompt: dict, params, request_id: str, session_id: str | None = None):
        """Our SamplingParams in (greedy, max_tokens, ignore_eos); each step's new tokens out."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        sampling = SamplingParams(
            temperature=0,
            max_tokens=params.max_tokens,
            ignore_eos=params.ignore_eos,
            output_kind=RequestOutputKind.DELTA,
        )
        tokens = TokensPrompt(prompt_token_ids=prompt["prompt_token_ids"])
        async for output in self.engine.generate(tokens, sampling, request_id):
            yield SimpleNamespace(token_ids=list(output.outputs[0].token_ids))

    def stats(self) -> SpecCounters:
        from vllm.v1.metrics.reader import get_metrics_snapshot

        found = {metric.name: metric for metric in get_metrics_snapshot()}

        def count(name: str) -> int:
            metric = found.get(name)
            return int(metric.value) if metric is not None else 0

        return SpecCounters(
            count("vllm:spec_decode_num_draft_tokens"), count("vllm:spec_decode_num_accepted_tokens")
        )

    def shutdown(self) -> None:
        self.engine.shutdown()
