"""KL estimators: formulas, aliases, clamps, zero at equality, k3 >= 0, and unbiasedness by sampling."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridrl.algorithms import KL_PENALTY_KINDS, kl_penalty

FAST = settings(max_examples=30, deadline=None)
finite_logprobs = st.lists(st.floats(-40.0, 0.0), min_size=1, max_size=16)


def test_kinds_cover_verl_names():
    assert set(KL_PENALTY_KINDS) == {"k1", "kl", "abs", "k2", "mse", "k3", "low_var_kl"}


def test_formulas_elementwise():
    logprob = torch.tensor([-1.0, -2.0, -0.5])
    ref = torch.tensor([-1.5, -1.0, -0.5])
    d = [0.5, -1.0, 0.0]
    expected = {
        "k1": d,
        "abs": [abs(x) for x in d],
        "k2": [0.5 * x * x for x in d],
        "k3": [math.exp(-x) - 1 + x for x in d],
    }
    for kind, values in expected.items():
        assert torch.allclose(kl_penalty(logprob, ref, kind), torch.tensor(values), atol=1e-6), kind


@pytest.mark.parametrize("alias,canonical", [("kl", "k1"), ("mse", "k2"), ("low_var_kl", "k3")])
def test_aliases_agree(alias, canonical):
    g = torch.Generator().manual_seed(0)
    logprob, ref = -torch.rand(4, 5, generator=g) * 3, -torch.rand(4, 5, generator=g) * 3
    assert torch.equal(kl_penalty(logprob, ref, alias), kl_penalty(logprob, ref, canonical))


def test_k3_clamps_like_verl():
    logprob = torch.tensor([-30.0, 0.0, -5.0])
    ref = torch.tensor([0.0, -30.0, -5.0 + 11.0])
    # ref - logprob = 30 -> clamped to 20 -> e^20 - 21, clamped to 10; = -30 -> clamped to -20 -> e^-20 + 19 -> 10;
    # = 11 -> e^11 - 12 -> 10.
    assert torch.equal(kl_penalty(logprob, ref, "k3"), torch.tensor([10.0, 10.0, 10.0]))
    just_inside = kl_penalty(torch.tensor([0.0]), torch.tensor([-2.0]), "k3")
    assert math.isclose(just_inside.item(), math.exp(-2) - 1 + 2, rel_tol=1e-6)


def test_unknown_kind_names_it_and_lists_valid_ones():
    with pytest.raises(ValueError) as excinfo:
        kl_penalty(torch.zeros(1), torch.zeros(1), "full")
    assert "'full'" in str(excinfo.value) and "low_var_kl" in str(excinfo.value)


@FAST
@given(values=finite_logprobs, kind=st.sampled_from(KL_PENALTY_KINDS))
def test_every_estimator_is_zero_when_log_probs_are_equal(values, kind):
    logprob = torch.tensor(values)
    assert torch.all(kl_penalty(logprob, logprob.clone(), kind) == 0)


@FAST
@given(values=finite_logprobs, refs=finite_logprobs)
def test_k3_is_non_negative(values, refs):
    n = min(len(values), len(refs))
    estimate = kl_penalty(torch.tensor(values[:n]), torch.tensor(refs[:n]), "k3")
    assert torch.all(estimate >= 0)
    assert torch.all(kl_penalty(torch.tensor(values[:n]), torch.tensor(refs[:n]), "k2") >= 0)


@pytest.mark.parametrize("kind", ["k1", "k3"])
def test_k1_and_k3_are_unbiased_estimates_of_kl(kind):
    """Sampling tokens from the policy, the mean estimate approaches KL(policy || reference)."""
    g = torch.Generator().manual_seed(0)
    policy = torch.log_softmax(torch.randn(6, generator=g), -1)
    reference = torch.log_softmax(torch.randn(6, generator=g), -1)
    exact = (policy.exp() * (policy - reference)).sum().item()
    tokens = torch.multinomial(policy.exp(), 200_000, replacement=True, generator=g)
    estimate = kl_penalty(policy[tokens], reference[tokens], kind).mean().item()
    assert math.isclose(estimate, exact, abs_tol=0.01), (estimate, exact)


def test_gradient_flows_to_the_policy_log_prob():
    logprob = torch.tensor([-1.0, -2.0], requires_grad=True)
    kl_penalty(logprob, torch.tensor([-1.5, -1.0]), "k2").sum().backward()
    assert torch.allclose(logprob.grad, torch.tensor([0.5, -1.0]))  # d/dx of (x - r)^2 / 2
