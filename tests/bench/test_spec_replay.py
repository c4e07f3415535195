from bench.spec_replay import replay

PROMPT = list(range(100, 140))


def test_a_reply_that_quotes_its_prompt_replays_faster_than_one_token_a_step():
    figures = replay([(PROMPT, [7, *PROMPT[:30]])], draft_length=6, row_cost=0.044)
    assert figures["acceptance"] > 0.9 and figures["speedup"] > 3


def test_a_reply_with_nothing_to_match_drafts_nothing_and_costs_one_step_a_token():
    figures = replay([(PROMPT, list(range(500, 530)))], draft_length=6, row_cost=0.044)
    assert figures == {"speedup": 1.0, "drafted": 0, "acceptance": None}


def test_rejected_drafts_cost_their_rows():
    reply = [1, 2, 9, 1, 3, 9, 1, 4, 9, 1, 5, 9, 1, 6, 9]  # "9 1" drafts what came next last time: wrong
    figures = replay([([5, 6], reply)], draft_length=6, row_cost=0.5)
    assert figures["drafted"] > 0 and figures["speedup"] < 1
