import pytest
import torch

from memory.session_memory.config import MemoryConfig
from memory.session_memory.eviction import choose_slots


def test_everything_is_kept_within_budget():
    assert choose_slots(list(range(10)), torch.zeros(10), budget=10, sinks=2, recent=3) == list(range(10))


def test_sinks_recent_and_the_most_attended_middle_tokens_are_kept():
    positions = list(range(40))
    importance = torch.zeros(40)
    importance[[8, 24]] = torch.tensor([0.9, 0.5])
    kept = choose_slots(positions, importance, budget=20, sinks=2, recent=4)
    assert kept == [0, 1, *range(5, 12), *range(21, 28), 36, 37, 38, 39]  # each with three neighbours a side


def test_a_heavy_hitter_brings_its_neighbours_before_weaker_hitters_further_away():
    importance = torch.zeros(40)
    importance[[20, 21, 22]] = torch.tensor([0.1, 0.9, 0.2])
    importance[8] = 0.5
    kept = choose_slots(list(range(40)), importance, budget=9, sinks=2, recent=4)
    assert kept == [0, 1, 20, 21, 22, 36, 37, 38, 39]


def test_the_baseline_keeps_sinks_and_the_latest_tokens_only():
    importance = torch.zeros(20)
    importance[7] = 1.0
    kept = choose_slots(list(range(20)), importance, budget=8, sinks=2, recent=4, heavy_hitters=False)
    assert kept == [0, 1, 14, 15, 16, 17, 18, 19]


def test_a_protected_prefix_is_kept_and_positions_not_slots_decide_it():
    positions = [0, 1, 2, 3, 10, 11, 12, 20, 21, 22, 23, 24]  # already compressed once
    kept = choose_slots(positions, torch.arange(12.0), budget=9, sinks=2, recent=3, protected_prefix=4)
    assert kept[:4] == [0, 1, 2, 3] and kept[-3:] == [9, 10, 11] and len(kept) == 9


def test_a_prefix_longer_than_the_budget_still_fits():
    kept = choose_slots(list(range(50)), torch.zeros(50), budget=10, sinks=4, recent=4, protected_prefix=40)
    assert len(kept) == 10 and kept[-4:] == [46, 47, 48, 49]


@pytest.mark.parametrize(
    "options, message",
    [
        ({"session_budget_tokens": 100, "recent_tokens": 100}, "must exceed"),
        ({"session_budget_tokens": 4096, "global_budget_tokens": 1000}, "global_budget_tokens"),
        ({"idle_seconds": 0}, "idle_seconds"),
    ],
)
def test_bad_memory_settings_are_refused(tmp_path, options, message):
    with pytest.raises(ValueError, match=message):
        MemoryConfig(data_dir=tmp_path, **options)
