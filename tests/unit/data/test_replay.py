"""The prioritized prompt replay buffer against slow references written here."""

from __future__ import annotations

import itertools
import math

import pytest

from hybridrl.data.replay import PrioritizedReplay, group_score_spread


def test_single_draw_frequencies_follow_priority_power():
    buffer = PrioritizedReplay(10, alpha=2.0, eps=0.1, seed=3)
    priorities = {"a": 0.0, "b": 1.0, "c": 2.0}
    for key, priority in priorities.items():
        buffer.add(key, key.upper(), priority)
    weights = {key: (p + 0.1) ** 2 for key, p in priorities.items()}
    expected = {key: w / sum(weights.values()) for key, w in weights.items()}
    draws = 6000
    counts = {key: 0 for key in priorities}
    for step in range(draws):
        [(key, item)] = buffer.sample(1, step)
        assert item == key.upper()
        counts[key] += 1
    for key, probability in expected.items():  # 4-sigma binomial band
        assert abs(counts[key] / draws - probability) < 4 * math.sqrt(probability * (1 - probability) / draws)


def test_two_item_draw_is_sequential_without_replacement():
    """Reference: P({i, j}) = p_i p_j / (1 - p_i) + p_j p_i / (1 - p_j) — sequential draws without replacement."""
    buffer = PrioritizedReplay(10, alpha=1.0, eps=1e-3, seed=0)
    for key, priority in (("a", 1.0), ("b", 2.0), ("c", 5.0)):
        buffer.add(key, None, priority)
    keys, probabilities = buffer.probabilities()
    p = dict(zip(keys, probabilities.tolist()))
    draws = 6000
    counts: dict[frozenset, int] = {}
    for step in range(draws):
        pair = frozenset(key for key, _ in buffer.sample(2, step))
        assert len(pair) == 2
        counts[pair] = counts.get(pair, 0) + 1
    for i, j in itertools.combinations(keys, 2):
        expected = p[i] * p[j] / (1 - p[i]) + p[j] * p[i] / (1 - p[j])
        observed = counts.get(frozenset((i, j)), 0) / draws
        assert abs(observed - expected) < 4 * math.sqrt(expected * (1 - expected) / draws)


def test_eviction_drops_lowest_priority_then_oldest():
    buffer = PrioritizedReplay(3, seed=0)
    buffer.add("old-low", 1, 0.1)
    buffer.add("new-low", 2, 0.1)
    buffer.add("high", 3, 5.0)
    buffer.add("mid", 4, 1.0)  # over capacity: the older of the two lowest goes
    assert set(buffer.entries) == {"new-low", "high", "mid"}
    buffer.add("high", 30, 0.0)  # refreshing a key replaces its item and priority
    buffer.add("late", 5, 2.0)
    assert set(buffer.entries) == {"new-low", "mid", "late"}


def test_sampling_is_reproducible_and_resumable():
    buffer = PrioritizedReplay(8, seed=5)
    for index in range(8):
        buffer.add(index, index, float(index % 3))
    first = buffer.sample(3, step=11)
    restored = PrioritizedReplay(8, seed=5)
    restored.load_state_dict(buffer.state_dict())
    assert restored.sample(3, step=11) == first
    assert buffer.sample(3, step=12) != first or buffer.sample(3, step=13) != first


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="capacity"):
        PrioritizedReplay(0)
    with pytest.raises(ValueError, match="priority"):
        PrioritizedReplay(2).add("k", None, -1.0)


def test_group_score_spread():
    assert group_score_spread([1, 1, 1, 1]) == 0.0
    assert group_score_spread([0, 1]) == pytest.approx(0.5)
    assert group_score_spread([3.0]) == 0.0
