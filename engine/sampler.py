"""Next-token choice for a batch of rows, each with its own SamplingParams."""

import torch

from engine.sequence import Sequence


def sample(logits: torch.Tensor, seqs: list[Sequence], generator: torch.Generator) -> list[int]:
    """logits: (rows, vocab) float32, one row per sequence."""
    if any(seq.params.repetition_penalty != 1.0 for seq in seqs):
        logits = apply_repetition_penalty(logits, seqs)
    chosen = logits.argmax(dim=-1)
    random_rows = [row for row, seq in enumerate(seqs) if not seq.params.greedy]
    if random_rows:
        rows = torch.tensor(random_rows, device=logits.device)
        chosen[rows] = sample_random(logits[rows], [seqs[row] for row in random_rows], generator)
    return chosen.tolist()


def apply_repetition_penalty(logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
    # As in transformers: a seen token's logit is divided by the penalty if positive, multiplied if not.
    logits = logits.clone()
    for row, seq in enumerate(seqs):
        penalty = seq.params.repetition_penalty
        if penalty == 1.0:
            continue
        seen = torch.tensor(sorted(set(seq.token_ids)), device=logits.device)
        values = logits[row, seen]
        logits[row, seen] = torch.where(values > 0, values / penalty, values * penalty)
    return logits


def sample_random(logits: torch.Tensor, seqs: list[Sequence], generator: torch.Generator) -> torch.Tensor:
    temperatures = torch.tensor([seq.params.temperature for seq in seqs], device=logits.device)
    logits = logits / temperatures[:, None]
    logits = mask_top_k_top_p(logits, seqs)
    probs = logits.softmax(dim=-1)
    # probs / Exp(1) noise has its argmax distributed as probs; noise per row lets a seed fix a row.
    noise = torch.empty_like(probs)
    for row, seq in enumerate(seqs):
        noise[row].exponential_(generator=seq.generator or generator)
    return (probs / noise).argmax(dim=-1)


def mask_top_k_top_p(logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
    top_k = [seq.params.top_k if seq.params.top_k > 0 else logits.shape[-1] for seq in seqs]
    top_p = [seq.params.top_p for seq in seqs]
    if min(top_k) >= logits.shape[-1] and min(top_p) >= 1.0:
        return logits
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    ranks = torch.arange(logits.shape[-1], device=logits.device)
    beyond_k = ranks[None, :] >= torch.tensor(top_k, device=logits.device)[:, None]
    sorted_logits = sorted_logits.masked_fill(beyond_k, float("-inf"))
    probs = sorted_logits.softmax(dim=-1)
    # A token is outside top-p when the tokens before it already reach p; the first is always kept.
    beyond_p = probs.cumsum(dim=-1) - probs >= torch.tensor(top_p, device=logits.device)[:, None]
    sorted_logits = sorted_logits.masked_fill(beyond_p, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)
