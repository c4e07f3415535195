"""Drafting rules compared without a clock: greedy replies replayed through the drafter.

    .venv/bin/python -m bench.spec_replay [--requests 30] [--draft-lengths 6 8] [--row-cost 0.044]

Generates the greedy replies (speculation off) of bench/speculative.py's workloads once, `--requests` of
each (support chats: that many chats of 10 turns), then replays every reply through engine/speculative.py's
drafter as the engine runs it at batch 1: each step drafts from the text so far, keeps the drafts that
equal the reply, and emits one token more.  The figure is the speed-up over decoding without drafts when a
step costs 1 + `--row-cost` per drafted row (0.044 on the 2-core AMX machine, bf16: a step of 17 rows took
22.4 ms against 13.2 for one).  Deterministic and quick, it compares drafting rules over ten times the
requests bench.speculative times at batch 1 (3 a workload); the clock still has the last word there.
Results: bench/results/<machine kind>/spec_replay_<dtype>.json.
"""

import argparse
import random

from bench import spec_workloads
from bench.machine import describe, write_results
from engine import LLM, SamplingParams
from engine.config import EngineConfig
from engine.speculative import DraftState, NgramDrafter

Reply = tuple[list[int], list[int]]  # prompt token ids, greedy reply token ids


def greedy(llm: LLM, requests: list[spec_workloads.Request]) -> list[Reply]:
    params = [
        SamplingParams(temperature=0, max_tokens=r.max_tokens, ignore_eos=r.ignore_eos) for r in requests
    ]
    outputs = llm.generate([{"prompt_token_ids": r.prompt_token_ids} for r in requests], params)
    return [(r.prompt_token_ids, o.outputs[0].token_ids) for r, o in zip(requests, outputs, strict=True)]


def support_replies(llm: LLM, count: int, seed: int) -> list[Reply]:
    """Every turn of `count` 10-turn support chats, each turn's prompt holding the whole history."""
    chats = spec_workloads.support_chats(count, seed)
    histories = [[{"role": "system", "content": spec_workloads.SUPPORT_SYSTEM}] for _ in chats]
    replies = []
    for turn in range(len(chats[0])):
        for history, questions in zip(histories, chats, strict=True):
            history.append({"role": "user", "content": questions[turn]})
        requests = [spec_workloads.chat_request(llm.tokenizer, history, 64) for history in histories]
        for history, reply in zip(histories, greedy(llm, requests), strict=True):
            history.append(
                {"role": "assistant", "content": llm.tokenizer.decode(reply[1], skip_special_tokens=True)}
            )
            replies.append(reply)
    return replies


def replies_of(llm: LLM, workload: str, count: int, seed: int) -> list[Reply]:
    if workload == "support_chat":
        return support_replies(llm, count, seed)
    if workload == "offline":
        return greedy(llm, spec_workloads.requests(workload, llm.tokenizer, count, seed))
    make = {"kb_answers": spec_workloads.kb_answer, "rewrite": spec_workloads.rewrite}[workload]
    return greedy(llm, [make(llm.tokenizer, random.Random(seed + i)) for i in range(count)])


def replay(replies: list[Reply], draft_length: int, row_cost: float) -> dict:
    """Steps as the engine takes them at batch 1; the first token comes from the prefill, as there."""
    cost = drafted = accepted = tokens = 0
    for prompt, reply in replies:
        drafter = NgramDrafter(draft_length, EngineConfig.prompt_lookup_min, EngineConfig.prompt_lookup_max)
        state, position = DraftState.of_prompt(prompt), 1
        while position < len(reply):
            state.sync(reply[:position])
            draft = drafter.propose(state, len(reply) - position - 1)
            kept = next((i for i, token in enumerate(draft) if token != reply[position + i]), len(draft))
            if draft:
                state.record(len(draft), kept)
            drafted, accepted, cost = drafted + len(draft), accepted + kept, cost + 1 + row_cost * len(draft)
            position += kept + 1
        tokens += len(reply) - 1
    return {
        "speedup": tokens / cost,
        "drafted": drafted,
        "acceptance": accepted / drafted if drafted else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=30)
    parser.add_argument("--draft-lengths", type=int, nargs="+", default=[6])
    parser.add_argument("--row-cost", type=float, default=0.044)
    parser.add_argument("--dtype", default="bfloat16")
    args = parser.parse_args()
    from engine.default_model import default_model_dir

    llm = LLM(str(default_model_dir()), dtype=args.dtype)
    figures = {}
    for workload in spec_workloads.WORKLOADS:
        replies = replies_of(llm, workload, args.requests, seed=1000)
        for k in args.draft_lengths:
            figures[f"{workload} K={k}"] = replay(replies, k, args.row_cost)
            print(workload, k, figures[f"{workload} K={k}"])
    write_results(f"spec_replay_{args.dtype}", {"machine": describe(None), **vars(args), "figures": figures})


if __name__ == "__main__":
    main()
