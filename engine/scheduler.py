"""Continuous batching with chunked prefill, in vLLM v1's one rule: each step shares a token budget,
first among running sequences (a decode needs one token, a prefill a chunk), then among waiting ones.

When the block pool runs short, the lowest-priority running sequence is preempted by recompute: its
blocks go back (keeping their prefix-cache hashes) and it waits at the front of the queue.

With speculative decoding, decoding sequences then get drafts out of the budget that is left: drafts
never delay another request's tokens, and never preempt or evict anything for their slots.
"""

from engine.block_manager import BlockManager
from engine.config import EngineConfig
from engine.sequence import ScheduledSeq, Sequence, Status
from engine.session_kv import SessionCache
from engine.speculative import LIKELY_ACCEPTANCE, MAX_STEP_ROWS, DraftState, NgramDrafter


class Scheduler:
    def __init__(
        self,
        config: EngineConfig,
        block_manager: BlockManager,
        session_kv: SessionCache,
        max_model_len: int,
        cheap_step_rows: int | None = None,
    ):
        self.max_num_seqs = config.max_num_seqs
        # Rows a step holds for about the cost of one (the model's rows_per_weight_pass), if known.
        self.cheap_step_rows = min(cheap_step_rows or MAX_STEP_ROWS, MAX_STEP_ROWS)
        self.max_model_len = max_model_len
        self.drafter = None
        if config.speculative == "ngram":
            self.drafter = NgramDrafter(
                config.num_speculative_tokens, config.prompt_lookup_min, config.prompt_lookup_max
            )
        self.max_num_batched_tokens = config.max_num_batched_tokens
        self.short_first = config.scheduling_policy == "short_first"
        self.block_manager = block_manager
        self.session_kv = session_kv
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> list[ScheduledSeq]:
        budget = self.max_num_batched_tokens
        scheduled, preempted = self.schedule_running(budget)
        budget -= sum(item.num_new_tokens for item in scheduled)
        if not preempted:
            scheduled += self.schedule_waiting(budget)
        if self.drafter is not None:
            self.add_drafts(scheduled)
        return scheduled

    def schedule_running(self, budget: int) -> tuple[list[ScheduledSeq], bool]:
        scheduled: list[ScheduledSeq] = []
        preempted = False
        index = 0
        while index < len(self.running) and budget > 0:
            seq = self.running[index]
            count = min(seq.num_uncomputed_tokens, budget)
            while not self.allocate(seq, count):
                victim = self.running.pop()
                self.preempt(victim)
                preempted = True
                if victim is seq:
                    return scheduled, preempted
            scheduled.append(ScheduledSeq(seq, count))
            budget -= count
            index += 1
        return scheduled, preempted

    def schedule_waiting(self, budget: int) -> list[ScheduledSeq]:
        scheduled: list[ScheduledSeq] = []
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.next_waiting()
            self.begin(seq)
            count = min(seq.num_uncomputed_tokens, budget)
            if not self.allocate(seq, count):
                self.give_back(seq)  # a waiting sequence holds no blocks: no deadlock between waiters
                break
            self.record_reuse(seq)
            self.waiting.remove(seq)
            seq.status = Status.RUNNING
            self.running.append(seq)
            scheduled.append(ScheduledSeq(seq, count))
            budget -= count
        return scheduled

    def add_drafts(self, scheduled: list[ScheduledSeq]) -> None:
        """Drafts for decoding sequences, best acceptance first, within the token budget.  A step's rows
        up to cheap_step_rows cost about one row; past them each row adds about a decoded token's
        arithmetic, so only a sequence whose drafts are usually accepted, or whose first draft it is
        (likely), takes those rows, and none past MAX_STEP_ROWS."""
        rows = sum(item.num_new_tokens for item in scheduled)
        decoding = [i for i in scheduled if i.num_new_tokens == 1 and i.seq.num_uncomputed_tokens == 1]
        for item in decoding:
            if item.seq.draft is None:
                item.seq.draft = DraftState.of_prompt(item.seq.prompt_token_ids)
        for item in sorted(
            decoding, key=lambda item: (likely(item.seq.draft), item.seq.draft.acceptance), reverse=True
        ):
            seq = item.seq
            budget = (
                min(self.max_num_batched_tokens, MAX_STEP_ROWS if likely(seq.draft) else self.cheap_step_rows)
                - rows
            )
            if budget <= 0:
                return  # the rest come after in the same order, so their limit is no higher
            seq.draft.sync(seq.output_token_ids)
            # The step emits the accepted drafts and one more token: within max_tokens and the context.
            room = min(
                budget,
                seq.params.max_tokens - len(seq.output_token_ids) - 1,
                self.max_model_len - seq.num_tokens - 1,
            )
            drafts = self.drafter.propose(seq.draft, room)
            if drafts and self.allocate_draft(seq, len(drafts)):
                item.draft_token_ids = drafts
                rows += len(drafts)

    def allocate_draft(self, seq: Sequence, count: int) -> bool:
        """Slots for a draft, leaving a free block for each running sequence's next token."""
        manager = self.block_manager
        needed = manager.blocks_needed(seq.num_computed_tokens + 1 + count) - len(seq.block_table)
        return needed <= manager.num_free_blocks - len(self.running) and manager.allocate_slots(
            seq, 1 + count
        )

    def begin(self, seq: Sequence) -> None:
        """Put the KV that can be reused under the sequence: its session's, else the prefix cache's."""
        if seq.session_id is not None:
            self.session_kv.attach(seq)
        self.block_manager.take_cached_prefix(seq)

    def give_back(self, seq: Sequence) -> None:
        if seq.session_id is not None and self.session_kv.attached(seq):
            self.session_kv.detach(seq)
        else:  # the prefix-cache blocks stay cached
            self.block_manager.free(seq)
            seq.num_computed_tokens = 0

    def record_reuse(self, seq: Sequence) -> None:
        """Count a sequence's first start in the reuse figures (prefix cache or session KV)."""
        if seq.num_cached_tokens >= 0:
            return
        if seq.text_start:
            seq.num_cached_tokens = seq.text_start
            self.session_kv.reused_tokens += seq.text_start
        else:
            self.block_manager.record_prefix_lookup(seq)

    def allocate(self, seq: Sequence, count: int) -> bool:
        if self.block_manager.allocate_slots(seq, count):
            return True
        self.session_kv.make_room(
            self.block_manager.blocks_needed(seq.num_computed_tokens + count) - len(seq.block_table)
        )
        return self.block_manager.allocate_slots(seq, count)

    def next_waiting(self) -> Sequence:
        if not self.short_first:
            return self.waiting[0]
        # Least remaining work first; preempted sequences (already started) keep their place in front.
        return min(self.waiting, key=lambda seq: (seq.num_cached_tokens < 0, remaining_work(seq)))

    def preempt(self, seq: Sequence) -> None:
        self.block_manager.free(seq)
        seq.num_computed_tokens = 0
        seq.status = Status.WAITING
        self.waiting.insert(0, seq)
        self.num_preemptions += 1

    def finish(self, seq: Sequence, reason: str) -> None:
        seq.status = Status.FINISHED
        seq.finish_reason = reason
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.block_manager.free(seq)


def remaining_work(seq: Sequence) -> int:
    return seq.num_uncomputed_tokens + seq.params.max_tokens - len(seq.output_token_ids)


def likely(draft: DraftState) -> bool:
    """Whether a sequence's drafts are usually accepted, or it has yet to draft: its first draft shows it."""
    return draft.drafted == 0 or draft.acceptance >= LIKELY_ACCEPTANCE
