"""pass@k and maj@k against brute force: every k-subset of the samples enumerated."""

from __future__ import annotations

import itertools
import random
from collections import Counter

import pytest

from hybridrl.rewards.pass_at_k import SampleJudgement, check_ks, majority_correct, pass_at_k


def brute_force_pass_at_k(correct: list[bool], k: int) -> float:
    """The share of k-subsets of the samples that hold at least one right sample."""
    subsets = list(itertools.combinations(range(len(correct)), k))
    return sum(any(correct[i] for i in subset) for subset in subsets) / len(subsets)


@pytest.mark.parametrize("n", [1, 2, 5, 8])
def test_pass_at_k_equals_the_share_of_k_subsets_with_a_right_sample(n):
    rng = random.Random(n)
    for _ in range(20):
        correct = [rng.random() < 0.3 for _ in range(n)]
        for k in range(1, n + 1):
            assert pass_at_k(n, sum(correct), k) == pytest.approx(brute_force_pass_at_k(correct, k), abs=1e-12)


def test_pass_at_k_edges_and_large_n():
    assert pass_at_k(4, 0, 2) == 0.0 and pass_at_k(4, 4, 1) == 1.0 and pass_at_k(4, 3, 2) == 1.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert 0.0 < pass_at_k(2000, 3, 100) < 1.0           # no overflow where C(2000, 100) would
    with pytest.raises(ValueError, match="1 <= k <= n"):
        pass_at_k(4, 1, 5)


def brute_force_majority(samples: list[SampleJudgement]) -> bool:
    counts = Counter(sample.answer for sample in samples)
    best = max(counts.values())
    first_best = [sample.answer for sample in samples if counts[sample.answer] == best][0]
    return any(sample.correct for sample in samples if sample.answer == first_best)


def test_majority_vote_over_the_first_k_samples():
    samples = [SampleJudgement("12", False), SampleJudgement("7", True), SampleJudgement("7", True),
               SampleJudgement("12", False), SampleJudgement("12", False)]
    assert majority_correct(samples, 3) is True          # 7 twice among the first three
    assert majority_correct(samples) is False            # 12 three times among all five
    assert majority_correct(samples, 2) is False         # a tie: the answer seen first (12) wins
    rng = random.Random(0)
    for _ in range(200):
        samples = [SampleJudgement(str(rng.randint(0, 3)), False) for _ in range(rng.randint(1, 7))]
        samples = [SampleJudgement(s.answer, s.answer == "2") for s in samples]
        for k in range(1, len(samples) + 1):
            assert majority_correct(samples, k) == brute_force_majority(samples[:k])


def test_ks_are_checked_against_the_samples_per_prompt():
    assert check_ks([4, 1, 4], 4) == [1, 4]
    with pytest.raises(ValueError, match=r"--k \[8\].*--n=4"):
        check_ks([1, 8], 4)
