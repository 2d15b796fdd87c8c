"""Advantage estimators against slow per-row loops, hand-computed cases and invariances."""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridrl.algorithms import ADVANTAGE_ESTIMATORS
from hybridrl.algorithms.advantages import group_ids

REQUIRED = ("gae", "grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "remax", "drgrpo")
FAST = settings(max_examples=30, deadline=None)


# ----------------------------------------------------------------------------------------------- references
def whiten_reference(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    chosen = values[mask.bool()]
    out = torch.zeros_like(values)
    if chosen.numel() >= 2:
        out[mask.bool()] = (chosen - chosen.mean()) / torch.sqrt(chosen.var(unbiased=True) + 1e-8)
    return out


def gae_reference(rewards, values, mask, gamma, lam):
    """Scalar loop; masked tokens are skipped: no TD error, they carry the next valid token's advantage."""
    batch, length = rewards.shape
    advantages = torch.zeros(batch, length, dtype=torch.float64)
    for i in range(batch):
        next_value, last = 0.0, 0.0
        for t in reversed(range(length)):
            if mask[i, t]:
                delta = rewards[i, t].item() + gamma * next_value - values[i, t].item()
                last = delta + gamma * lam * last
                next_value = values[i, t].item()
            advantages[i, t] = last
    return advantages.float()


def gae_textbook(rewards, values, length_i, gamma, lam):
    """A_t = sum_l (gamma lam)^l delta_{t+l} over a right-padded row of `length_i` valid tokens (V after end = 0)."""
    v = [values[t].item() for t in range(length_i)] + [0.0]
    deltas = [rewards[t].item() + gamma * v[t + 1] - v[t] for t in range(length_i)]
    return [sum((gamma * lam) ** (l - t) * deltas[l] for l in range(t, length_i)) for t in range(length_i)]


def grouped(scores, index):
    groups = defaultdict(list)
    for i, label in enumerate(index):
        groups[label].append(scores[i])
    return groups


def grpo_reference(rewards, mask, index, epsilon, divide):
    scores = [(rewards[i] * mask[i]).sum().item() for i in range(rewards.shape[0])]
    groups = grouped(scores, index)
    out = torch.zeros_like(rewards)
    for i, label in enumerate(index):
        members = groups[label]
        mean, std = (0.0, 1.0) if len(members) == 1 else (float(np.mean(members)), float(np.std(members, ddof=1)))
        advantage = (scores[i] - mean) / (std + epsilon) if divide else scores[i] - mean
        out[i] = advantage * mask[i]
    return out


def return_to_go_reference(rewards, mask, gamma):
    """verl's REINFORCE++ return: the carried return is reset after every masked token."""
    batch, length = rewards.shape
    out = torch.zeros_like(rewards)
    for i in range(batch):
        running = 0.0
        for t in reversed(range(length)):
            running = rewards[i, t].item() + gamma * running
            out[i, t] = running
            running = running if mask[i, t] else 0.0
    return out


@pytest.fixture(scope="module")
def make_batch(ragged_mask):
    """``make_batch(seed, batch, length, holes) -> (rewards, values, mask)``, rewards zero on padding."""

    def make(seed, batch=6, length=5, holes=False):
        g = torch.Generator().manual_seed(seed)
        mask = ragged_mask(batch, length, g, holes=holes)
        rewards = torch.randn(batch, length, generator=g) * mask
        values = torch.randn(batch, length, generator=g)
        return rewards, values, mask

    return make


def uniform_kwargs(rewards, values, mask, index):
    """The one kwarg set the trainer passes to every estimator."""
    return dict(
        token_level_rewards=rewards, values=values, response_mask=mask, gamma=0.99, lam=0.95, index=index,
        epsilon=1e-6, norm_adv_by_std_in_grpo=True, reward_baselines=torch.zeros(rewards.shape[0]), config=None,
    )


# ----------------------------------------------------------------------------------------------- registry
def test_registry_has_verl_names_and_helpful_errors():
    assert set(REQUIRED) <= set(ADVANTAGE_ESTIMATORS.names())
    with pytest.raises(ValueError, match="grpo"):
        ADVANTAGE_ESTIMATORS["gpro"]


@pytest.mark.parametrize("name", REQUIRED)
def test_every_estimator_takes_the_uniform_kwargs_and_zeroes_masked_positions(name, make_batch):
    rewards, values, mask = make_batch(3, batch=6, length=5, holes=True)
    index = np.array(["a", "a", "b", "b", "b", "c"], dtype=object)
    advantages, returns = ADVANTAGE_ESTIMATORS[name](**uniform_kwargs(rewards, values, mask, index))
    assert advantages.shape == returns.shape == rewards.shape
    assert torch.all(advantages[mask == 0] == 0)
    assert torch.isfinite(advantages).all() and torch.isfinite(returns).all()
    assert advantages[mask.bool()].abs().sum() > 0  # not trivially zero


# ----------------------------------------------------------------------------------------------- GAE
def test_gae_by_hand():
    rewards = torch.tensor([[0.0, 0.0, 1.0]])
    values = torch.tensor([[0.5, 0.2, 0.1]])
    mask = torch.ones(1, 3)
    advantages, returns = ADVANTAGE_ESTIMATORS["gae"](
        token_level_rewards=rewards, values=values, response_mask=mask, gamma=0.9, lam=0.8, whiten=False
    )
    # delta_2 = 1 - 0.1 = 0.9; delta_1 = 0.9*0.1 - 0.2 = -0.11; delta_0 = 0.9*0.2 - 0.5 = -0.32; gamma*lam = 0.72
    expected = torch.tensor([[-0.32 + 0.72 * (-0.11 + 0.72 * 0.9), -0.11 + 0.72 * 0.9, 0.9]])
    assert torch.allclose(advantages, expected, atol=1e-6)
    assert torch.allclose(returns, expected + values, atol=1e-6)


@pytest.mark.parametrize(
    "seed,batch,length,holes", [(0, 6, 5, False), (1, 4, 9, True), (2, 8, 1, False), (3, 5, 7, True)]
)
@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.99, 0.95), (0.7, 0.3)])
def test_gae_matches_loop_reference(seed, batch, length, holes, gamma, lam, make_batch):
    rewards, values, mask = make_batch(seed, batch, length, holes)
    raw, returns = ADVANTAGE_ESTIMATORS["gae"](
        token_level_rewards=rewards, values=values, response_mask=mask, gamma=gamma, lam=lam, whiten=False
    )
    reference = gae_reference(rewards, values, mask, gamma, lam)
    assert torch.allclose(raw, reference * mask, atol=1e-5)
    assert torch.allclose(returns, reference + values, atol=1e-5)  # returns use the raw advantages
    whitened, returns_again = ADVANTAGE_ESTIMATORS["gae"](
        token_level_rewards=rewards, values=values, response_mask=mask, gamma=gamma, lam=lam
    )
    assert torch.allclose(whitened, whiten_reference(reference, mask), atol=1e-4)
    assert torch.equal(returns, returns_again)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gae_matches_textbook_formula_on_right_padded_rows(seed, make_batch):
    rewards, values, mask = make_batch(seed, batch=5, length=6)
    raw, _ = ADVANTAGE_ESTIMATORS["gae"](
        token_level_rewards=rewards, values=values, response_mask=mask, gamma=0.9, lam=0.7, whiten=False
    )
    for i in range(5):
        n = int(mask[i].sum())
        assert torch.allclose(raw[i, :n], torch.tensor(gae_textbook(rewards[i], values[i], n, 0.9, 0.7)), atol=1e-5)


@FAST
@given(seed=st.integers(0, 10_000), batch=st.integers(1, 6), length=st.integers(1, 8))
def test_gae_with_unit_gamma_lambda_is_reward_to_go_minus_value(seed, batch, length, make_batch):
    rewards, values, mask = make_batch(seed, batch, length)
    raw, _ = ADVANTAGE_ESTIMATORS["gae"](
        token_level_rewards=rewards, values=values, response_mask=mask, gamma=1.0, lam=1.0, whiten=False
    )
    reward_to_go = rewards.flip(-1).cumsum(-1).flip(-1)
    assert torch.allclose(raw, (reward_to_go - values) * mask, atol=1e-5)


# ----------------------------------------------------------------------------------------------- GRPO family
def test_grpo_group_by_hand():
    rewards = torch.tensor([[0.0, 1.0], [0.0, 0.0], [0.0, 0.0], [1.0, 0.0], [2.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 1.0], [1.0, 0.0], [1.0, 0.0], [1.0, 0.0]])
    index = [7, 7, 7, 7, 9]  # scores 1, 0, 0, 1 in one group; a singleton with score 2
    advantages, returns = ADVANTAGE_ESTIMATORS["grpo"](token_level_rewards=rewards, response_mask=mask, index=index)
    z = 0.5 / (math.sqrt(1.0 / 3.0) + 1e-6)  # mean 0.5, unbiased std sqrt(1/3)
    expected = torch.tensor([[z, z], [-z, -z], [-z, 0.0], [z, 0.0], [2.0 / (1.0 + 1e-6), 0.0]])
    assert torch.allclose(advantages, expected, atol=1e-6)
    assert torch.equal(advantages, returns)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("divide", [True, False])
def test_grpo_matches_loop_reference_for_every_index_type(seed, divide, make_batch):
    rewards, _, mask = make_batch(seed, batch=9, length=4)
    labels = ["p0", "p1", "p0", "p2", "p1", "p0", "p3", "p1", "p2"]  # group sizes 3, 3, 2, 1
    reference = grpo_reference(rewards, mask, labels, 1e-6, divide)
    as_ints = torch.tensor([int(label[1]) for label in labels])
    for index in (np.array(labels, dtype=object), np.array(labels), labels, as_ints):
        advantages, _ = ADVANTAGE_ESTIMATORS["grpo"](
            token_level_rewards=rewards, response_mask=mask, index=index, norm_adv_by_std_in_grpo=divide
        )
        assert torch.allclose(advantages, reference, atol=1e-5)


def test_drgrpo_is_grpo_without_std_whatever_the_flag(make_batch):
    rewards, _, mask = make_batch(5, batch=6, length=3)
    index = [0, 0, 0, 1, 1, 1]
    expected, _ = ADVANTAGE_ESTIMATORS["grpo"](
        token_level_rewards=rewards, response_mask=mask, index=index, norm_adv_by_std_in_grpo=False
    )
    for flag in (True, False):
        advantages, _ = ADVANTAGE_ESTIMATORS["drgrpo"](
            token_level_rewards=rewards, response_mask=mask, index=index, norm_adv_by_std_in_grpo=flag
        )
        assert torch.allclose(advantages, expected)
    divided, _ = ADVANTAGE_ESTIMATORS["grpo"](token_level_rewards=rewards, response_mask=mask, index=index)
    assert not torch.allclose(divided, expected)  # the std division does change something here


@FAST
@given(
    seed=st.integers(0, 10_000),
    group_sizes=st.lists(st.integers(2, 4), min_size=1, max_size=4),
    # quarters: every shifted sum is exact in float32. An arbitrary float makes tied rows differ by one rounding
    # (1 ulp), which GRPO's division by a ~1e-6 std blows up to O(1) advantages (seed=763, shift=10.296...)
    shift=st.integers(-200, 200).map(lambda quarters: quarters / 4),
    estimator=st.sampled_from(["grpo", "drgrpo", "rloo", "reinforce_plus_plus_baseline"]),
)
def test_group_estimators_invariant_to_a_constant_added_to_a_group(seed, group_sizes, shift, estimator):
    g = torch.Generator().manual_seed(seed)
    index = [group for group, size in enumerate(group_sizes) for _ in range(size)]
    batch, length = len(index), 4
    lengths = torch.randint(1, length + 1, (batch,), generator=g)  # every row has a token to carry the shift
    mask = (torch.arange(length) < lengths.unsqueeze(1)).float()
    rewards = torch.randint(0, 2, (batch, length), generator=g).float() * mask
    shifted = rewards.clone()
    in_group_0 = torch.tensor(index) == 0
    shifted[in_group_0, 0] += shift
    before, _ = ADVANTAGE_ESTIMATORS[estimator](token_level_rewards=rewards, response_mask=mask, index=index)
    after, _ = ADVANTAGE_ESTIMATORS[estimator](token_level_rewards=shifted, response_mask=mask, index=index)
    assert torch.allclose(before, after, atol=1e-3)


def test_grpo_single_member_groups_are_not_shift_invariant():
    """The documented exception: a group of one uses mean 0, std 1, so its advantage is its own score."""
    rewards, mask = torch.tensor([[3.0]]), torch.ones(1, 1)
    advantages, _ = ADVANTAGE_ESTIMATORS["grpo"](token_level_rewards=rewards, response_mask=mask, index=["x"])
    assert torch.allclose(advantages, torch.tensor([[3.0 / (1 + 1e-6)]]))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_rloo_matches_leave_one_out_loop(seed, make_batch):
    rewards, _, mask = make_batch(seed, batch=8, length=4)
    index = ["a", "a", "a", "b", "b", "c", "c", "c"]
    index[7] = "d"  # a singleton keeps its raw score
    scores = (rewards * mask).sum(-1).tolist()
    expected = torch.zeros_like(rewards)
    for i, label in enumerate(index):
        others = [scores[j] for j in range(8) if index[j] == label and j != i]
        advantage = scores[i] - float(np.mean(others)) if others else scores[i]
        expected[i] = advantage * mask[i]
    advantages, returns = ADVANTAGE_ESTIMATORS["rloo"](token_level_rewards=rewards, response_mask=mask, index=index)
    assert torch.allclose(advantages, expected, atol=1e-5)
    assert torch.equal(advantages, returns)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_reinforce_plus_plus_baseline_matches_loop(seed, make_batch):
    rewards, _, mask = make_batch(seed, batch=7, length=5)
    index = [0, 0, 1, 1, 1, 2, 3]
    centred = grpo_reference(rewards, mask, index, 0.0, divide=False)
    advantages, returns = ADVANTAGE_ESTIMATORS["reinforce_plus_plus_baseline"](
        token_level_rewards=rewards, response_mask=mask, index=index
    )
    assert torch.allclose(advantages, whiten_reference(centred, mask), atol=1e-4)
    assert torch.equal(advantages, returns)


def test_group_index_validation():
    assert group_ids(["b", "a", "b"], 3).tolist() == [0, 1, 0]
    assert group_ids(torch.tensor([5, 2, 5]), 3).tolist() == [1, 0, 1]
    with pytest.raises(ValueError, match="one per row"):
        group_ids(["a", "b"], 3)
    with pytest.raises(TypeError, match="hashable"):
        group_ids([["a"], ["b"]], 2)


# ----------------------------------------------------------------------------------------------- REINFORCE++, ReMax
def test_reinforce_plus_plus_returns_by_hand():
    rewards = torch.tensor([[1.0, 0.0, 2.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    advantages, returns = ADVANTAGE_ESTIMATORS["reinforce_plus_plus"](
        token_level_rewards=rewards, response_mask=mask, gamma=0.5
    )
    assert torch.allclose(returns, torch.tensor([[1.5, 1.0, 2.0, 0.0]]))
    assert torch.allclose(advantages, whiten_reference(returns, mask), atol=1e-5)


@pytest.mark.parametrize("seed,holes", [(0, False), (1, True), (2, True)])
@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_reinforce_plus_plus_matches_loop(seed, holes, gamma, make_batch):
    rewards, _, mask = make_batch(seed, batch=6, length=7, holes=holes)
    advantages, returns = ADVANTAGE_ESTIMATORS["reinforce_plus_plus"](
        token_level_rewards=rewards, response_mask=mask, gamma=gamma
    )
    expected_returns = return_to_go_reference(rewards, mask, gamma)
    assert torch.allclose(returns, expected_returns, atol=1e-5)
    assert torch.allclose(advantages, whiten_reference(expected_returns, mask), atol=1e-4)


def test_remax_by_hand():
    rewards = torch.tensor([[0.0, 0.0, 1.0, 0.0], [0.5, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
    baselines = torch.tensor([0.25, 1.0])
    advantages, returns = ADVANTAGE_ESTIMATORS["remax"](
        token_level_rewards=rewards, response_mask=mask, reward_baselines=baselines
    )
    assert torch.allclose(returns, torch.tensor([[1.0, 1.0, 1.0, 0.0], [0.5, 0.0, 0.0, 0.0]]))
    assert torch.allclose(advantages, torch.tensor([[0.75, 0.75, 0.75, 0.0], [-0.5, 0.0, 0.0, 0.0]]))
    with pytest.raises(ValueError, match="one entry per row"):
        ADVANTAGE_ESTIMATORS["remax"](token_level_rewards=rewards, response_mask=mask, reward_baselines=torch.zeros(3))


@pytest.mark.parametrize("seed", [0, 1])
def test_remax_matches_loop(seed, make_batch):
    rewards, _, mask = make_batch(seed, batch=5, length=6)
    baselines = torch.randn(5, generator=torch.Generator().manual_seed(seed))
    advantages, returns = ADVANTAGE_ESTIMATORS["remax"](
        token_level_rewards=rewards, response_mask=mask, reward_baselines=baselines
    )
    for i in range(5):
        for t in range(6):
            to_go = sum(rewards[i, s].item() * mask[i, s].item() for s in range(t, 6))
            assert math.isclose(returns[i, t].item(), to_go, abs_tol=1e-5)
            expected = (to_go - baselines[i].item()) * mask[i, t].item()
            assert math.isclose(advantages[i, t].item(), expected, abs_tol=1e-5)


def test_shape_mismatch_is_a_value_error():
    with pytest.raises(ValueError, match="values"):
        ADVANTAGE_ESTIMATORS["gae"](
            token_level_rewards=torch.zeros(2, 3), values=torch.zeros(2, 4), response_mask=torch.ones(2, 3)
        )
