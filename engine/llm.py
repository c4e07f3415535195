"""The offline API, shaped like vLLM's: LLM(model=...).generate(prompts, params) and .chat(...)."""

import itertools

from engine.config import EngineConfig
from engine.llm_engine import LLMEngine, Prompt
from engine.outputs import CompletionOutput, RequestOutput
from engine.sampling_params import SamplingParams


class LLM:
    def __init__(self, model: str, **engine_options):
        self.engine = LLMEngine(EngineConfig(model=model, **engine_options))
        self.request_ids = itertools.count()

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def generate(
        self, prompts: Prompt | list[Prompt], params: SamplingParams | list[SamplingParams] | None = None
    ) -> list[RequestOutput]:
        if isinstance(prompts, str | dict) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        params = params or SamplingParams()
        params_list = params if isinstance(params, list) else [params] * len(prompts)
        if len(params_list) != len(prompts):
            raise ValueError(f"got {len(params_list)} SamplingParams for {len(prompts)} prompts")
        seqs = [
            self.engine.add_request(str(next(self.request_ids)), prompt, request_params)
            for prompt, request_params in zip(prompts, params_list, strict=True)
        ]
        texts = {seq.request_id: "" for seq in seqs}
        while self.engine.has_unfinished_requests():
            for update in self.engine.step():
                texts[update.seq.request_id] += update.new_text
        return [to_request_output(seq, texts[seq.request_id]) for seq in seqs]

    def chat(
        self, conversations: list[dict] | list[list[dict]], params: SamplingParams | None = None
    ) -> list[RequestOutput]:
        if conversations and isinstance(conversations[0], dict):
            conversations = [conversations]
        prompts = [
            self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            for messages in conversations
        ]
        return self.generate(prompts, params)


def to_request_output(seq, text: str) -> RequestOutput:
    completion = CompletionOutput(0, text, list(seq.output_token_ids), seq.finish_reason)
    return RequestOutput(
        request_id=seq.request_id,
        prompt=seq.prompt,
        prompt_token_ids=seq.prompt_token_ids,
        outputs=[completion],
        finished=seq.is_finished,
        num_cached_tokens=max(seq.num_cached_tokens, 0),
    )
