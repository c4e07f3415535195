"""What an engine's steps compute, recorded for tests: the logits each step samples from, and the tokens
and steps requests take."""

import torch

from engine.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams


def record_logits(engine: LLMEngine) -> dict[tuple[str, int], torch.Tensor]:
    """From now on, by request and the position they predict, the logits of every row a step samples
    from that rests on emitted tokens only: a plain row, a drafted sequence's last token and the rows of
    its accepted drafts."""
    recorded, emit = {}, engine.runner.emit

    def recording(samplers, logits, meta):
        emitted = emit(samplers, logits, meta)
        row = 0
        for _, item in samplers:
            seq = item.seq
            for offset in range(len(emitted[seq])):  # the accepted drafts and the row after them
                recorded[seq.request_id, seq.num_tokens + offset] = logits[row + offset].clone()
            row += 1 + len(item.draft_token_ids)
        return emitted

    engine.runner.emit = recording
    return recorded


def run_to_end(
    engine: LLMEngine, prompts: dict[str, str], params: SamplingParams
) -> tuple[dict[str, list[int]], int]:
    """Adds each request (id: prompt) and steps until all finish: (tokens by request, steps taken)."""
    for request_id, prompt in prompts.items():
        engine.add_request(request_id, prompt, params)
    tokens, steps = {request_id: [] for request_id in prompts}, 0
    while engine.has_unfinished_requests():
        for update in engine.step():
            tokens[update.seq.request_id] += update.new_token_ids
        steps += 1
    return tokens, steps
