"""Policy losses: PPO clip branches by hand, loop references, GSPO / CISPO gradients, micro-batch invariance."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridrl.algorithms import LOSS_AGG_MODES, POLICY_LOSSES, aggregate_loss, loss_normalizer

FAST = settings(max_examples=30, deadline=None)
METRIC_KEYS = {"pg_loss", "pg_clipfrac", "pg_clipfrac_lower", "ppo_kl"}


def random_inputs(seed, batch, length, ragged_mask, spread=0.5, holes=False):
    g = torch.Generator().manual_seed(seed)
    mask = ragged_mask(batch, length, g, holes=holes)
    old = -torch.rand(batch, length, generator=g, dtype=torch.float64) * 3
    new = (old + torch.randn(batch, length, generator=g, dtype=torch.float64) * spread).requires_grad_()
    advantages = torch.randn(batch, length, generator=g, dtype=torch.float64)
    return old, new, advantages, mask


def ppo_token_loss(old, new, advantage, low, high, c):
    ratio = math.exp(min(max(new - old, -20.0), 20.0))
    loss = max(-advantage * ratio, -advantage * min(max(ratio, 1 - low), 1 + high))
    return min(loss, -advantage * c) if advantage < 0 else loss


# ----------------------------------------------------------------------------------------------- vanilla PPO
def test_ppo_clip_branches_by_hand():
    ratios = torch.tensor([[1.5, 0.5, 0.5, 5.0, 2.0]], dtype=torch.float64)
    advantages = torch.tensor([[1.0, 1.0, -1.0, -1.0, -1.0]], dtype=torch.float64)
    old = torch.full_like(ratios, -1.0)
    new = (old + ratios.log()).requires_grad_()
    loss, metrics = POLICY_LOSSES["vanilla"](
        old_log_prob=old, log_prob=new, advantages=advantages, response_mask=torch.ones_like(ratios),
        clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0, loss_agg_mode="token-mean",
    )
    # A>0 r=1.5: clipped at 1.28 | A>0 r=0.5: unclipped | A<0 r=0.5: clipped at 0.8 | A<0 r=5: dual clip at 3
    # | A<0 r=2: unclipped (2 < 3)
    per_token = [-1.28, -0.5, 0.8, 3.0, 2.0]
    assert loss.item() == pytest.approx(sum(per_token) / 5)
    assert metrics["pg_clipfrac"].item() == pytest.approx(2 / 5)
    assert metrics["pg_clipfrac_lower"].item() == pytest.approx(1 / 5)
    assert metrics["ppo_kl"].item() == pytest.approx(-ratios.log().mean().item())
    loss.backward()
    # d loss / d log_prob = -A * r on unclipped tokens, 0 where a clip (or the dual-clip constant) is active
    expected_grad = torch.tensor([[0.0, -0.5, 0.0, 0.0, 2.0]], dtype=torch.float64) / 5
    assert torch.allclose(new.grad, expected_grad)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_vanilla_matches_loop_reference(mode, seed, ragged_mask):
    old, new, advantages, mask = random_inputs(seed, 7, 6, ragged_mask, spread=0.6, holes=seed == 2)
    low, high, c = 0.2, 0.28, 3.0
    per_token = torch.tensor(
        [[ppo_token_loss(old[i, t].item(), new[i, t].item(), advantages[i, t].item(), low, high, c)
          for t in range(6)] for i in range(7)], dtype=torch.float64,
    )
    loss, metrics = POLICY_LOSSES["vanilla"](
        old_log_prob=old, log_prob=new, advantages=advantages, response_mask=mask,
        clip_ratio_low=low, clip_ratio_high=high, clip_ratio_c=c, loss_agg_mode=mode,
    )
    assert loss.item() == pytest.approx(aggregate_loss(per_token, mask, mode).item(), abs=1e-10)
    assert set(metrics) >= METRIC_KEYS
    assert all(v.dim() == 0 and not v.requires_grad for v in metrics.values())
    assert metrics["pg_loss"].item() == loss.item()
    assert 0.0 < metrics["pg_clipfrac"].item() < 1.0  # the random ratios exercise both branches


def test_dual_clip_bound_must_exceed_one():
    old, new, advantages, mask = torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1, 2)
    with pytest.raises(ValueError, match="clip_ratio_c"):
        POLICY_LOSSES["vanilla"](old_log_prob=old, log_prob=new, advantages=advantages, response_mask=mask,
                                 clip_ratio_c=1.0)


# ----------------------------------------------------------------------------------------------- GSPO
def gspo_sequence_reference(old, new, advantages, mask, low, high):
    """The sequence-level GSPO objective written directly: mean over sequences of the clipped s_i * A_i."""
    terms = []
    for i in range(old.shape[0]):
        valid = mask[i].bool()
        if not valid.any():
            continue
        s = torch.exp((new[i][valid] - old[i][valid]).mean())
        a = advantages[i][valid][0]  # sequence-level advantage, as GRPO produces
        terms.append(torch.maximum(-a * s, -a * torch.clamp(s, 1 - low, 1 + high)))
    return torch.stack(terms).mean()


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_gspo_value_and_gradient_equal_the_sequence_level_objective(seed, ragged_mask):
    old, new, _, mask = random_inputs(seed, 8, 5, ragged_mask, spread=0.05)
    g = torch.Generator().manual_seed(100 + seed)
    advantages = torch.randn(8, 1, generator=g, dtype=torch.float64).expand(8, 5)
    low, high = 0.01, 0.015
    loss, metrics = POLICY_LOSSES["gspo"](
        old_log_prob=old, log_prob=new, advantages=advantages, response_mask=mask, clip_ratio_low=low,
        clip_ratio_high=high, clip_ratio_c=3.0, loss_agg_mode="seq-mean-token-mean",
    )
    (grad,) = torch.autograd.grad(loss, new)
    reference = gspo_sequence_reference(old, new, advantages, mask, low, high)
    (reference_grad,) = torch.autograd.grad(reference, new)
    assert loss.item() == pytest.approx(reference.item(), abs=1e-10)
    assert torch.allclose(grad, reference_grad, atol=1e-10)
    assert metrics["pg_clipfrac_lower"].item() == 0.0
    assert set(metrics) >= METRIC_KEYS


def test_gspo_ratio_is_the_geometric_mean_by_hand():
    old = torch.zeros(1, 3, dtype=torch.float64)
    new = torch.log(torch.tensor([[2.0, 0.5, 4.0]], dtype=torch.float64))  # geometric mean = 4 ** (1/3)
    advantages, mask = torch.ones(1, 3, dtype=torch.float64), torch.tensor([[1.0, 1.0, 0.0]])
    loss, _ = POLICY_LOSSES["gspo"](old_log_prob=old, log_prob=new, advantages=advantages, response_mask=mask,
                                    clip_ratio_low=10.0, clip_ratio_high=10.0)  # wide: nothing clipped
    assert loss.item() == pytest.approx(-1.0)  # mean of log 2 and log 0.5 is 0: ratio 1 (token 3 is padding)


# ----------------------------------------------------------------------------------------------- CISPO
def test_cispo_keeps_gradient_on_clipped_tokens():
    old = torch.zeros(1, 3, dtype=torch.float64)
    new = torch.log(torch.tensor([[2.0, 1.1, 0.1]], dtype=torch.float64)).requires_grad_()
    advantages = torch.tensor([[1.0, -2.0, 0.5]], dtype=torch.float64)
    loss, metrics = POLICY_LOSSES["cispo"](
        old_log_prob=old, log_prob=new, advantages=advantages, response_mask=torch.ones(1, 3),
        clip_ratio_low=0.2, clip_ratio_high=0.28,
    )
    weights = torch.tensor([[1.28, 1.1, 0.8]], dtype=torch.float64)  # clip(ratio): clipped, inside, clipped
    assert loss.item() == pytest.approx((-weights * advantages * new.detach()).mean().item())
    assert metrics["pg_clipfrac"].item() == pytest.approx(2 / 3)
    loss.backward()
    assert torch.allclose(new.grad, -weights * advantages / 3)  # non-zero even where the weight was clipped


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_cispo_matches_reference(mode, ragged_mask):
    old, new, advantages, mask = random_inputs(4, 6, 5, ragged_mask)
    weight = torch.clamp(torch.exp(new.detach() - old), 0.8, 1.2)
    loss, _ = POLICY_LOSSES["cispo"](old_log_prob=old, log_prob=new, advantages=advantages, response_mask=mask,
                                     clip_ratio_low=0.2, clip_ratio_high=0.2, loss_agg_mode=mode)
    expected = aggregate_loss(-weight * advantages * new.detach(), mask, mode)
    assert loss.item() == pytest.approx(expected.item(), abs=1e-10)


# ----------------------------------------------------------------------------------------------- micro-batching
@FAST
@given(
    seed=st.integers(0, 10_000),
    batch=st.integers(1, 8),
    cut_fraction=st.floats(0.0, 1.0),
    name=st.sampled_from(["vanilla", "gspo", "cispo"]),
    mode=st.sampled_from(LOSS_AGG_MODES),
)
def test_policy_losses_accumulate_exactly_over_micro_batches(seed, batch, cut_fraction, name, mode, ragged_mask):
    old, new, advantages, mask = random_inputs(seed, batch, 5, ragged_mask, spread=0.3)
    kwargs = dict(clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0, loss_agg_mode=mode)
    whole, _ = POLICY_LOSSES[name](old_log_prob=old, log_prob=new, advantages=advantages, response_mask=mask,
                                   **kwargs)
    (whole_grad,) = torch.autograd.grad(whole, new)
    cut = round(cut_fraction * batch)
    normalizer = loss_normalizer(mask[:cut], mode) + loss_normalizer(mask[cut:], mode)  # the "all-reduce"
    total = 0.0
    for piece in (slice(0, cut), slice(cut, batch)):
        part, _ = POLICY_LOSSES[name](old_log_prob=old[piece], log_prob=new[piece], advantages=advantages[piece],
                                      response_mask=mask[piece], normalizer=normalizer, **kwargs)
        total = total + part
    (split_grad,) = torch.autograd.grad(total, new)
    assert total.item() == pytest.approx(whole.item(), abs=1e-10)
    assert torch.allclose(split_grad, whole_grad, atol=1e-12)


@pytest.mark.parametrize("name", ["vanilla", "gspo", "cispo"])
def test_uniform_call_and_masked_positions_get_no_gradient(name, ragged_mask):
    old, new, advantages, mask = random_inputs(9, 5, 4, ragged_mask, holes=True)
    loss, metrics = POLICY_LOSSES[name](
        old_log_prob=old, log_prob=new, advantages=advantages, response_mask=mask, clip_ratio_low=0.2,
        clip_ratio_high=0.28, clip_ratio_c=3.0, loss_agg_mode="token-mean", normalizer=None, some_future_flag=1,
    )
    loss.backward()
    assert torch.all(new.grad[mask == 0] == 0) and new.grad.abs().sum() > 0
    assert set(metrics) >= METRIC_KEYS
