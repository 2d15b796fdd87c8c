"""Sequence partitioning: invariants (hypothesis), brute-force optimality bounds, KK vs greedy, hand-computed cases."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridrl.data.partition import (
    balance_across_ranks,
    flatten_partition,
    greedy_partition,
    karmarkar_karp,
    partition_by_token_budget,
    partition_stats,
    restore_order,
)

FAST = settings(max_examples=50, deadline=None)
PARTITIONERS = [karmarkar_karp, greedy_partition]

weights_lists = st.lists(st.integers(min_value=0, max_value=1000), max_size=40)


# ----------------------------------------------------------------------------------------------- helpers
def part_sums(weights, parts):
    return [sum(weights[i] for i in part) for part in parts]


def spread(weights, parts):
    sums = part_sums(weights, parts)
    return max(sums) - min(sums)


def assert_is_partition(parts, num_items, num_parts):
    assert len(parts) == num_parts
    assert sorted(i for part in parts for i in part) == list(range(num_items))
    for part in parts:
        assert part == sorted(part)


def brute_force_optimum(weights, num_parts, equal_size):
    """(smallest possible largest part, smallest possible spread) over every assignment — the slow reference."""
    best_max, best_spread = math.inf, math.inf
    for assignment in itertools.product(range(num_parts), repeat=len(weights)):
        if equal_size and any(assignment.count(p) != len(weights) // num_parts for p in range(num_parts)):
            continue
        sums = [0] * num_parts
        for index, part in enumerate(assignment):
            sums[part] += weights[index]
        best_max, best_spread = min(best_max, max(sums)), min(best_spread, max(sums) - min(sums))
    return best_max, best_spread


def rl_like_lengths(rng, num_sequences):
    """Prompt + response token counts: uniform prompts, log-normal responses with a truncation spike at the max."""
    max_response = int(rng.choice([512, 1024, 4096]))
    prompts = rng.integers(32, 512, num_sequences)
    responses = np.minimum(rng.lognormal(np.log(max_response / 4), 1.0, num_sequences).astype(int) + 1, max_response)
    return (prompts + responses).tolist()


# ----------------------------------------------------------------------------------------------- invariants
@pytest.mark.parametrize("partition", PARTITIONERS, ids=lambda f: f.__name__)
@FAST
@given(weights=weights_lists, num_parts=st.integers(1, 6))
def test_every_index_exactly_once_and_parts_ordered(partition, weights, num_parts):
    parts = partition(weights, num_parts)
    assert_is_partition(parts, len(weights), num_parts)
    sums = part_sums(weights, parts)
    assert sums == sorted(sums, reverse=True)
    if len(weights) >= num_parts:
        assert all(parts), "a part is empty although there are enough items"


@pytest.mark.parametrize("partition", PARTITIONERS, ids=lambda f: f.__name__)
@FAST
@given(data=st.data(), num_parts=st.integers(1, 5))
def test_equal_size_gives_equal_counts(partition, data, num_parts):
    per_part = data.draw(st.integers(0, 8))
    weights = data.draw(st.lists(st.integers(0, 1000), min_size=num_parts * per_part, max_size=num_parts * per_part))
    parts = partition(weights, num_parts, equal_size=True)
    assert_is_partition(parts, len(weights), num_parts)
    assert [len(part) for part in parts] == [per_part] * num_parts


@FAST
@given(weights=st.lists(st.integers(0, 1000), min_size=1, max_size=40), num_parts=st.integers(1, 6))
def test_kk_spread_never_exceeds_the_largest_weight(weights, num_parts):
    """Merging two states never increases the larger spread, so the final spread is at most one item's weight."""
    assert spread(weights, karmarkar_karp(weights, num_parts)) <= max(weights)
    usable = len(weights) - len(weights) % num_parts
    if usable:
        equal = weights[:usable]
        assert spread(equal, karmarkar_karp(equal, num_parts, equal_size=True)) <= max(equal)


@FAST
@given(
    weights=st.lists(st.integers(0, 1000), max_size=30, unique=True),
    num_parts=st.integers(1, 5),
    seed=st.integers(0, 99),
)
def test_kk_is_deterministic_and_permutation_invariant_for_distinct_weights(weights, num_parts, seed):
    permutation = np.random.default_rng(seed).permutation(len(weights)).tolist()
    permuted = [weights[i] for i in permutation]
    parts = karmarkar_karp(weights, num_parts)
    assert karmarkar_karp(weights, num_parts) == parts
    as_sets = {frozenset(weights[i] for i in part) for part in parts}
    assert {frozenset(permuted[i] for i in part) for part in karmarkar_karp(permuted, num_parts)} == as_sets


def test_zero_weights_still_fill_every_part():
    parts = karmarkar_karp([0, 0, 0, 5], 3)
    assert parts == [[3], [0], [1, 2]]


def test_more_parts_than_items_leaves_empty_parts_last():
    assert karmarkar_karp([1, 2], 4) == [[1], [0], [], []]
    assert karmarkar_karp([], 3, equal_size=True) == [[], [], []]


def test_accepts_numpy_and_torch_integer_lengths():
    expected = karmarkar_karp([8, 7, 6, 5, 4], 2)
    assert karmarkar_karp(np.array([8, 7, 6, 5, 4]), 2) == expected
    assert karmarkar_karp(torch.tensor([8, 7, 6, 5, 4]), 2) == expected


# ----------------------------------------------------------------------------------------------- hand cases
def test_kk_two_way_hand_case():
    """Differencing 8,7,6,5,4 ends at 2: {7,5,4}=16 vs {8,6}=14. Greedy gets {8,5,4}=17 vs {7,6}=13; optimum is 0."""
    weights = [8, 7, 6, 5, 4]
    assert karmarkar_karp(weights, 2) == [[1, 3, 4], [0, 2]]
    assert greedy_partition(weights, 2) == [[0, 3, 4], [1, 2]]
    assert brute_force_optimum(weights, 2, equal_size=False) == (15, 0)


def test_kk_equal_size_hand_case():
    """Groups (8,7), (6,5), (4,3): merge → {8,5}=13 | {7,6}=13, then with (4,3) reversed → 17 | 16."""
    parts = karmarkar_karp([8, 7, 6, 5, 4, 3], 2, equal_size=True)
    assert parts == [[0, 3, 4], [1, 2, 5]]
    assert part_sums([8, 7, 6, 5, 4, 3], parts) == [17, 16]


def test_single_part_holds_everything():
    assert karmarkar_karp([3, 1, 2], 1) == [[0, 1, 2]]
    assert greedy_partition([3, 1, 2], 1, equal_size=True) == [[0, 1, 2]]


# ----------------------------------------------------------------------------------------------- quality
@pytest.mark.parametrize("equal_size", [False, True])
def test_kk_against_brute_force_optimum(equal_size):
    """Largest part within the worst-case ratio; the spread is optimal in most tiny cases.

    Bounds: unconstrained LDM's largest part is at most ``4/3 − 1/(3k)`` times the optimum (Michiels et al. 2003);
    for the equal-size variant we assert the weaker ``2 − 1/k``. Observed worst ratios here: 1.08 (k=2), 1.09 (k=3)
    unconstrained and 1.13 equal-size; the optimal spread is found in ~90 % of cases.
    """
    rng = np.random.default_rng(1234 + equal_size)
    num_cases, num_optimal = 120, 0
    for _ in range(num_cases):
        num_parts = int(rng.choice([2, 3]))
        num_items = int(rng.integers(num_parts, 9))
        if equal_size:
            num_items -= num_items % num_parts
        weights = rng.integers(1, int(rng.choice([10, 100, 1000])), num_items).tolist()
        best_max, best_spread = brute_force_optimum(weights, num_parts, equal_size)
        parts = karmarkar_karp(weights, num_parts, equal_size=equal_size)
        ratio_bound = (2 - 1 / num_parts) if equal_size else (4 / 3 - 1 / (3 * num_parts))
        assert max(part_sums(weights, parts)) <= ratio_bound * best_max + 1e-9, (weights, num_parts, parts)
        assert best_spread <= spread(weights, parts) <= max(weights)
        num_optimal += spread(weights, parts) == best_spread
    assert num_optimal >= 0.75 * num_cases


@pytest.mark.parametrize(
    "equal_size, items_per_part, min_win_rate, max_mean_ratio",
    [
        # Thresholds sit well inside what six seeds measured (win rate = P[KK spread <= greedy spread]):
        (False, (4, 33), 0.90, 0.35),  # win rate 0.98-0.99; mean KK spread / mean greedy spread 0.11-0.17
        (True, (4, 33), 0.85, 0.70),  # win rate 0.95-0.98; ratio of means 0.30-0.50
        (False, (2, 9), 0.85, 0.80),  # win rate 0.93-0.96; ratio of means 0.58-0.67
        # Few items per part, equal counts: KK rarely loses, but when it does it can lose big (a truncation spike
        # leaves no room to compensate), so the means tie (ratio 0.94-1.05); only the win rate is asserted.
        (True, (2, 9), 0.75, None),  # win rate 0.81-0.89
    ],
)
def test_kk_beats_greedy_on_rl_like_lengths(equal_size, items_per_part, min_win_rate, max_mean_ratio):
    rng = np.random.default_rng(7 + equal_size + items_per_part[0])
    kk_spreads, greedy_spreads = [], []
    for _ in range(300):
        num_parts = int(rng.choice([2, 4, 8]))
        lengths = rl_like_lengths(rng, num_parts * int(rng.integers(*items_per_part)))
        kk_spreads.append(spread(lengths, karmarkar_karp(lengths, num_parts, equal_size=equal_size)))
        greedy_spreads.append(spread(lengths, greedy_partition(lengths, num_parts, equal_size=equal_size)))
    kk_spreads, greedy_spreads = np.array(kk_spreads), np.array(greedy_spreads)
    assert np.mean(kk_spreads <= greedy_spreads) >= min_win_rate
    if max_mean_ratio is not None:
        assert kk_spreads.mean() <= max_mean_ratio * greedy_spreads.mean()


# ----------------------------------------------------------------------------------------------- token budget
def test_token_budget_hand_cases():
    assert partition_by_token_budget([5, 5, 5, 5], 10) == [[0, 2], [1, 3]]
    assert partition_by_token_budget([5, 5, 5, 5], 9) == [[0], [1], [2], [3]]
    assert partition_by_token_budget([5, 5, 5, 5], 20) == [[0, 1, 2, 3]]
    assert partition_by_token_budget([7, 3, 6, 4], 10) == [[0, 1], [2, 3]]
    assert len(partition_by_token_budget([5, 5, 5, 5], 10, min_num_micro_batches=3)) == 3
    assert len(partition_by_token_budget([5, 5, 5, 5, 5], 25, num_micro_batches_multiple_of=2)) == 2
    # ceil(18 / 10) = 2 parts cannot hold 6+6+6 within 10 each: KK moves on to 3.
    assert partition_by_token_budget([6, 6, 6], 10) == [[0], [1], [2]]


@FAST
@given(
    lengths=st.lists(st.integers(0, 100), min_size=1, max_size=40),
    budget_slack=st.integers(0, 300),
    minimum=st.integers(1, 6),
    multiple=st.integers(1, 3),
)
def test_token_budget_invariants(lengths, budget_slack, minimum, multiple):
    budget = max(1, max(lengths)) + budget_slack
    try:
        micro_batches = partition_by_token_budget(
            lengths, budget, min_num_micro_batches=minimum, num_micro_batches_multiple_of=multiple
        )
    except ValueError as error:
        assert "len(lengths)" in str(error)
        return
    count = len(micro_batches)
    assert_is_partition(micro_batches, len(lengths), count)
    assert all(micro_batches)
    sums = part_sums(lengths, micro_batches)
    assert max(sums) <= budget
    assert sums == sorted(sums, reverse=True)
    assert count % multiple == 0
    assert count >= max(minimum, math.ceil(sum(lengths) / budget))
    if minimum == 1 and count - multiple >= max(1, math.ceil(sum(lengths) / budget)):
        assert max(part_sums(lengths, karmarkar_karp(lengths, count - multiple))) > budget, "a smaller count fits"


@FAST
@given(lengths=st.lists(st.integers(1, 100), min_size=1, max_size=40), budget_slack=st.integers(0, 200), data=st.data())
def test_token_budget_returns_exactly_the_requested_minimum(lengths, budget_slack, data):
    """The DP protocol relies on it: with min = max over ranks of the natural count, every rank returns min."""
    budget = max(lengths) + budget_slack
    multiple = data.draw(st.integers(1, 3))
    try:
        natural = len(partition_by_token_budget(lengths, budget, num_micro_batches_multiple_of=multiple))
    except ValueError:
        return
    minimum = data.draw(st.integers(1, len(lengths)))
    expected = max(natural, -(-minimum // multiple) * multiple)
    if expected <= len(lengths):
        got = partition_by_token_budget(
            lengths, budget, min_num_micro_batches=minimum, num_micro_batches_multiple_of=multiple
        )
        assert len(got) == expected


# KK at 37 parts overshoots 1411 tokens although its natural count, 34, fits (found on RL-like lengths).
KK_OVERSHOOT_LENGTHS = [
    899, 637, 892, 468, 368, 637, 686, 729, 496, 578, 683, 361, 643, 509, 616, 879, 754, 564, 418, 386, 637, 639, 886,
    714, 337, 726, 512, 334, 684, 498, 610, 491, 635, 600, 591, 401, 775, 544, 666, 787, 538, 429, 674, 511, 521, 424,
    546, 544, 498, 390, 725, 568, 499, 464, 498, 800, 492, 468, 558, 500, 580, 520, 514, 531, 446, 584, 506, 520, 528,
    454, 752, 461, 463, 887, 436,
]  # fmt: skip


def test_token_budget_honours_min_count_where_kk_overshoots():
    lengths, budget = KK_OVERSHOOT_LENGTHS, 1411
    assert len(partition_by_token_budget(lengths, budget)) == 34
    assert max(part_sums(lengths, karmarkar_karp(lengths, 37))) > budget  # the trap this test guards against
    micro_batches = partition_by_token_budget(lengths, budget, min_num_micro_batches=37)
    assert len(micro_batches) == 37
    assert_is_partition(micro_batches, len(lengths), 37)
    assert max(part_sums(lengths, micro_batches)) <= budget


# ----------------------------------------------------------------------------------------------- DP balancing
def test_balance_across_ranks():
    parts = balance_across_ranks([8, 7, 6, 5, 4, 3], 2)
    assert part_sums([8, 7, 6, 5, 4, 3], parts) == [17, 16]
    assert [len(part) for part in parts] == [3, 3]
    uneven = balance_across_ranks([8, 7, 6, 5, 4], 2, equal_size=False)
    assert part_sums([8, 7, 6, 5, 4], uneven) == [16, 14]


# ----------------------------------------------------------------------------------------------- order restoration
@FAST
@given(lengths=st.lists(st.integers(0, 500), max_size=30), num_parts=st.integers(1, 5))
def test_restore_order_is_the_identity(lengths, num_parts):
    parts = karmarkar_karp(lengths, num_parts)
    order, inverse = flatten_partition(parts)
    assert order == [i for part in parts for i in part]
    assert all(order[inverse[i]] == i for i in range(len(lengths)))
    original = [f"row{i}" for i in range(len(lengths))]
    concatenated = [original[i] for i in order]
    assert restore_order(concatenated, inverse) == original
    assert restore_order(tuple(concatenated), inverse) == tuple(original)
    table = torch.arange(len(lengths) * 3).reshape(len(lengths), 3)
    assert torch.equal(restore_order(table[torch.tensor(order, dtype=torch.long)], inverse), table)
    array = np.arange(len(lengths)) * 10
    assert np.array_equal(restore_order(array[np.array(order, dtype=int)], inverse), array)


def test_partition_stats_hand_case():
    stats = partition_stats([8, 7, 6, 5, 4], [[1, 3, 4], [0, 2]])
    assert stats == {
        "num_parts": 2.0,
        "max_tokens": 16.0,
        "min_tokens": 14.0,
        "mean_tokens": 15.0,
        "spread_tokens": 2.0,
        "imbalance_ratio": 16 / 15,
    }
    assert partition_stats([0, 0], [[0], [1]])["imbalance_ratio"] == 1.0


# ----------------------------------------------------------------------------------------------- errors
@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: karmarkar_karp([1, -2], 2), r"weights\[1\] must be non-negative"),
        (lambda: karmarkar_karp([1, 2], 0), "num_parts must be a positive integer"),
        (lambda: karmarkar_karp([1, 2, 3], 2, equal_size=True), r"len\(weights\) divisible"),
        (lambda: greedy_partition([1, 2, 3], 2, equal_size=True), r"len\(weights\) divisible"),
        (lambda: karmarkar_karp(np.ones((2, 2), dtype=int), 2), "weights must be 1-D"),
        (
            lambda: partition_by_token_budget([3, 12, 4], 10),
            r"lengths\[1\] = 12 tokens exceeds max_tokens_per_micro_batch = 10",
        ),
        (lambda: partition_by_token_budget([3], 0), "max_tokens_per_micro_batch must be a positive integer"),
        (lambda: partition_by_token_budget([3], 5, min_num_micro_batches=0), "min_num_micro_batches"),
        (lambda: partition_by_token_budget([3], 5, num_micro_batches_multiple_of=0), "num_micro_batches_multiple_of"),
        (lambda: partition_by_token_budget([5, 5, 5], 100, min_num_micro_batches=4), r"need at least 4 micro-batches"),
        (lambda: partition_by_token_budget([5] * 5, 9, num_micro_batches_multiple_of=2), "no count of micro-batches"),
        (lambda: balance_across_ranks([1, 2, 3], 2), "num_ranks=2"),
        (lambda: flatten_partition([[0, 1], [1]]), "index 1 is repeated"),
        (lambda: flatten_partition([[0, 3], [1]]), "index 3 is out of range"),
        (lambda: restore_order([1, 2, 3], [0, 1]), "values has 3 rows but inverse has 2"),
        (lambda: partition_stats([1, 2], []), "at least one part"),
        (lambda: partition_stats([1, 2], [[0, 2]]), "index 2"),
    ],
)
def test_errors_name_the_offending_argument(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_non_integer_lengths_are_a_type_error():
    with pytest.raises(TypeError, match=r"lengths\[0\] must be an integer"):
        partition_by_token_budget(torch.tensor([1.5, 2.0]), 10)
    with pytest.raises(TypeError, match="values must be a torch.Tensor"):
        restore_order({0: 1}, [0])
