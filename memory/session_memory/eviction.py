"""Which KV slots a session keeps when it outgrows its budget.

Kept whole: the attention sinks (the first tokens), a protected prefix (the system prompt, when the chat
service says how long it is) and the most recent tokens.  From the middle, the heavy hitters: the slots
with the most attention received (engine/layers/importance.py), summed over layers and heads,
because one layer's or head's view is noisy and one score per token is what a token-level keep needs.
Scores are max-pooled over neighbouring slots first (SnapKV's clustering), so a kept token brings the
tokens around it: a fact is a span (an order number is five digit tokens), and a lone digit is no fact.
"""

import torch
import torch.nn.functional as F

POOL = 7  # slots a score spreads over: the token and three on each side


def choose_slots(
    positions: list[int],
    importance: torch.Tensor,
    budget: int,
    sinks: int,
    recent: int,
    protected_prefix: int = 0,
    heavy_hitters: bool = True,
) -> list[int]:
    """Sorted slot indices to keep; all of them when they fit the budget."""
    count = len(positions)
    if count <= budget:
        return list(range(count))
    latest = set(range(max(0, count - recent), count))
    head = {i for i, position in enumerate(positions) if position < max(sinks, protected_prefix)} - latest
    if len(head) + len(latest) >= budget:  # a huge protected prefix still cannot break the budget
        return sorted(set(sorted(head)[: budget - len(latest)]) | latest)
    always = head | latest
    middle = [i for i in range(count) if i not in always]
    room = budget - len(always)
    if heavy_hitters:
        pooled = F.max_pool1d(importance.float()[None, None], POOL, stride=1, padding=POOL // 2)[0, 0]
        ranked = sorted(middle, key=lambda i: (float(pooled[i]), float(importance[i])), reverse=True)
        chosen = ranked[:room]
    else:
        chosen = middle[-room:]  # StreamingLLM: the window simply reaches further back
    return sorted(always | set(chosen))
