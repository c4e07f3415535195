"""What each intent may spend and what it loads into the context."""

from dataclasses import dataclass

from memory.retrieval.intent import Intent


@dataclass(frozen=True)
class Strategy:
    budget_share: float  # of the caller's token budget
    turn_share: float  # of this intent's budget, for the most recent turns
    max_hits: int  # hits the window grows from; 0 loads head, tail and key paragraphs instead
    expand_with_last_turn: bool  # the query alone ("why is that?") does not say what it is about


STRATEGIES = {
    Intent.FOLLOW_UP: Strategy(budget_share=0.6, turn_share=0.5, max_hits=2, expand_with_last_turn=True),
    Intent.FACT_CHECK: Strategy(budget_share=0.5, turn_share=0.2, max_hits=4, expand_with_last_turn=False),
    Intent.SUMMARY: Strategy(budget_share=1.0, turn_share=0.0, max_hits=0, expand_with_last_turn=False),
    Intent.KNOWLEDGE: Strategy(budget_share=0.5, turn_share=0.0, max_hits=5, expand_with_last_turn=False),
}
