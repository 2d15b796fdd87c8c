"""DPO / cDPO, IPO, SimPO, ORPO and KTO against slow per-pair loops in Python floats, their gradients where the
closed form is short, their accumulation invariant (micro-batch shares with the global count add up to the big
batch) and their refusals."""

from __future__ import annotations

import math

import pytest
import torch

from hybridrl.algorithms.preference_optimization import dpo_loss, ipo_loss, kto_loss, orpo_loss, simpo_loss

B = 7


def log_sigmoid(x: float) -> float:
    return -math.log1p(math.exp(-x)) if x >= 0 else x - math.log1p(math.exp(x))


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def pairs(seed: int = 0):
    """Policy and reference log-probs ``[B]`` (negative, like real ones) and lengths in tokens."""
    generator = torch.Generator().manual_seed(seed)
    logps = [-torch.rand(B, generator=generator, dtype=torch.float64) * 20 - 0.5 for _ in range(4)]
    lengths = [torch.randint(1, 30, (B,), generator=generator) for _ in range(2)]
    return (*logps, *lengths)


def floats(*tensors):
    return zip(*(tensor.tolist() for tensor in tensors))


@pytest.mark.parametrize("smoothing", [0.0, 0.2])
def test_dpo_and_cdpo_match_the_loop(smoothing):
    pc, pr, rc, rr, _, _ = pairs()
    beta = 0.3
    loss, metrics = dpo_loss(pc, pr, rc, rr, beta=beta, normalizer=B, label_smoothing=smoothing)
    slow = sum(-(1 - smoothing) * log_sigmoid(beta * ((a - c) - (b - d))) - smoothing * log_sigmoid(
        -beta * ((a - c) - (b - d))) for a, b, c, d in floats(pc, pr, rc, rr)) / B
    assert float(loss) == pytest.approx(slow, rel=1e-12)
    margins = [beta * ((a - c) - (b - d)) for a, b, c, d in floats(pc, pr, rc, rr)]
    assert float(metrics["margin"]) == pytest.approx(sum(margins) / B, rel=1e-12)
    assert float(metrics["accuracy"]) == pytest.approx(sum(m > 0 for m in margins) / B)


def test_dpo_gradient_is_the_closed_form_and_reaches_the_policy_only():
    pc, pr = torch.tensor([-3.0, -1.0], requires_grad=True), torch.tensor([-2.0, -4.0], requires_grad=True)
    rc, rr = torch.tensor([-2.5, -1.5], requires_grad=True), torch.tensor([-2.0, -3.0], requires_grad=True)
    loss, _ = dpo_loss(pc, pr, rc, rr, beta=0.5, normalizer=2)
    loss.backward()
    h = ((pc - rc) - (pr - rr)).detach()
    expected = -0.5 * torch.sigmoid(-0.5 * h) / 2  # d/dπ_c of softplus(−βh)/N
    assert torch.allclose(pc.grad, expected) and torch.allclose(pr.grad, -expected)
    assert rc.grad is None and rr.grad is None  # the reference is a constant


def test_ipo_matches_the_loop():
    pc, pr, rc, rr, _, _ = pairs(1)
    beta = 0.1
    loss, _ = ipo_loss(pc, pr, rc, rr, beta=beta, normalizer=B)
    slow = sum(((a - c) - (b - d) - 1 / (2 * beta)) ** 2 for a, b, c, d in floats(pc, pr, rc, rr)) / B
    assert float(loss) == pytest.approx(slow, rel=1e-12)


def test_simpo_matches_the_loop():
    pc, pr, _, _, lc, lr = pairs(2)
    beta, gamma = 2.0, 0.5
    loss, metrics = simpo_loss(pc, pr, lc, lr, beta=beta, gamma=gamma, normalizer=B)
    slow = sum(-log_sigmoid(beta * a / m - beta * b / n - gamma) for a, b, m, n in floats(pc, pr, lc, lr)) / B
    assert float(loss) == pytest.approx(slow, rel=1e-12)
    assert float(metrics["chosen_reward"]) == pytest.approx(sum(beta * a / m for a, m in floats(pc, lc)) / B)


def test_orpo_matches_the_loop():
    pc, pr, _, _, lc, lr = pairs(3)
    lam = 0.25

    def log_odds(mean):
        return mean - math.log(1 - math.exp(mean))
    tokens = int(lc.sum())
    loss, metrics = orpo_loss(pc, pr, lc, lr, lam=lam, pair_normalizer=B, token_normalizer=tokens)
    nll = -sum(pc.tolist()) / tokens
    odds = sum(-log_sigmoid(log_odds(a / m) - log_odds(b / n)) for a, b, m, n in floats(pc, pr, lc, lr)) / B
    assert float(loss) == pytest.approx(nll + lam * odds, rel=1e-12)
    assert float(metrics["nll"]) == pytest.approx(nll, rel=1e-12)


def test_kto_matches_the_loop():
    pc, _, rc, _, _, _ = pairs(4)
    desirable = torch.tensor([True, False, True, True, False, False, True])
    beta, z0, wd, wu = 0.2, 0.7, 1.0, 1.5
    loss, metrics = kto_loss(pc, rc, desirable, beta=beta, reference_point=z0, normalizer=B, desirable_weight=wd,
                             undesirable_weight=wu)
    slow = sum(wd * (1 - sigmoid(beta * ((a - c) - z0))) if good else wu * (1 - sigmoid(beta * (z0 - (a - c))))
               for a, c, good in floats(pc, rc, desirable)) / B
    assert float(loss) == pytest.approx(slow, rel=1e-12)
    assert float(metrics["reference_point"]) == z0
    negative, _ = kto_loss(pc, rc, desirable, beta=beta, reference_point=-3.0, normalizer=B)
    at_zero, _ = kto_loss(pc, rc, desirable, beta=beta, reference_point=0.0, normalizer=B)
    assert float(negative) == float(at_zero)  # z₀ is a KL estimate: never below 0


CUTS = (slice(0, 2), slice(2, 3), slice(3, B))


NAMES = ["dpo", "ipo", "simpo", "orpo", "kto"]


def share(name, chosen, rejected, part, seed=5):
    """Loss ``name``'s share for the pairs ``part`` of :func:`pairs`\ (``seed``) with the policy log-probs
    ``chosen`` / ``rejected`` in place of its own, normalised by the whole batch's counts."""
    _, _, rc, rr, lc, lr = pairs(seed)
    if name == "dpo":
        return dpo_loss(chosen[part], rejected[part], rc[part], rr[part], beta=0.1, normalizer=B,
                        label_smoothing=0.1)[0]
    if name == "ipo":
        return ipo_loss(chosen[part], rejected[part], rc[part], rr[part], beta=0.1, normalizer=B)[0]
    if name == "simpo":
        return simpo_loss(chosen[part], rejected[part], lc[part], lr[part], beta=2.0, gamma=1.0, normalizer=B)[0]
    if name == "orpo":
        return orpo_loss(chosen[part], rejected[part], lc[part], lr[part], lam=0.1, pair_normalizer=B,
                         token_normalizer=int(lc.sum()))[0]
    desirable = torch.arange(B) % 3 == 0  # KTO: unpaired rows; ``rejected`` takes no part
    return kto_loss(chosen[part], rc[part], desirable[part], beta=0.1, reference_point=0.3, normalizer=B)[0] + \
        0 * rejected[part].sum()


@pytest.mark.parametrize("name", NAMES)
def test_micro_batch_shares_with_the_global_counts_add_up_to_the_big_batch(name):
    pc, pr, *_ = pairs(5)
    whole = float(share(name, pc, pr, slice(0, B)))
    assert float(sum(share(name, pc, pr, part) for part in CUTS)) == pytest.approx(whole, rel=1e-12)


def test_bad_coefficients_and_shapes_are_refused_naming_them():
    pc, pr, rc, rr, lc, lr = pairs()
    with pytest.raises(ValueError, match="beta must be > 0, got 0"):
        dpo_loss(pc, pr, rc, rr, beta=0, normalizer=B)
    with pytest.raises(ValueError, match="label_smoothing must be in \\[0, 0.5\\)"):
        dpo_loss(pc, pr, rc, rr, beta=0.1, normalizer=B, label_smoothing=0.5)
    with pytest.raises(ValueError, match="gamma must be >= 0"):
        simpo_loss(pc, pr, lc, lr, beta=1.0, gamma=-1.0, normalizer=B)
    with pytest.raises(ValueError, match="lam must be >= 0"):
        orpo_loss(pc, pr, lc, lr, lam=-0.1, pair_normalizer=B, token_normalizer=10)
    with pytest.raises(ValueError, match="must all be \\[batch\\] tensors of one size"):
        ipo_loss(pc, pr[:3], rc, rr, beta=0.1, normalizer=B)
    with pytest.raises(ValueError, match="desirable_weight and undesirable_weight must be > 0"):
        kto_loss(pc, rc, pc > -5, beta=0.1, reference_point=0.0, normalizer=B, undesirable_weight=0)


def test_known_values():
    """Points where each loss has a value by hand: a zero margin, IPO's target, KTO at its reference point, equal
    responses in ORPO's odds term."""
    zero, one = torch.zeros(1, dtype=torch.float64), torch.ones(1, dtype=torch.float64)
    assert float(dpo_loss(-one, -one, -one, -one, beta=0.1, normalizer=1)[0]) == pytest.approx(math.log(2))
    target = 1 / (2 * 0.25)  # IPO's margin target 1/(2β): zero loss there
    assert float(ipo_loss(zero + target, zero, zero, zero, beta=0.25, normalizer=1)[0]) == pytest.approx(0.0)
    assert float(kto_loss(-one, -one - 0.5, torch.tensor([True]), beta=1.0, reference_point=0.5,
                          normalizer=1, desirable_weight=3.0)[0]) == pytest.approx(1.5)
    lengths = torch.tensor([4])
    loss, metrics = orpo_loss(-2 * one, -2 * one, lengths, lengths, lam=1.0, pair_normalizer=1, token_normalizer=4)
    assert float(loss) == pytest.approx(0.5 + math.log(2)) and float(metrics["log_odds_ratio"]) == 0.0
    assert float(simpo_loss(-one, -one, lengths, lengths, beta=1.0, gamma=0.0, normalizer=1)[0]) == \
        pytest.approx(math.log(2))


@pytest.mark.parametrize("name", NAMES)
def test_micro_batch_gradients_with_the_global_counts_add_up_to_the_big_batch(name):
    pc, pr, *_ = pairs(5)

    def gradients(parts):
        chosen, rejected = pc.clone().requires_grad_(), pr.clone().requires_grad_()
        for part in parts:
            share(name, chosen, rejected, part).backward()
        return chosen.grad, rejected.grad
    whole, accumulated = gradients([slice(0, B)]), gradients(CUTS)
    for full, parts in zip(whole, accumulated):
        assert torch.allclose(full, parts, rtol=1e-12, atol=1e-15)
    assert whole[0].abs().sum() > 0


def test_the_reference_gets_no_gradient_in_kto_either():
    policy, reference = torch.tensor([-3.0, -1.0], requires_grad=True), torch.tensor([-2.0, -2.0], requires_grad=True)
    loss, _ = kto_loss(policy, reference, torch.tensor([True, False]), beta=0.5, reference_point=0.1, normalizer=2)
    loss.backward()
    assert policy.grad.abs().sum() > 0 and reference.grad is None


def test_orpo_stays_finite_in_bf16_near_certain_responses():
    """A mean log-prob of −1e-3 (the model all but certain): 1 − e^ℓ rounds to 0 in bf16; the loss and its gradient
    stay finite."""
    chosen = torch.tensor([-4e-3], dtype=torch.bfloat16, requires_grad=True)
    rejected = torch.tensor([-2.0], dtype=torch.bfloat16, requires_grad=True)
    lengths = torch.tensor([4])
    loss, _ = orpo_loss(chosen, rejected, lengths, lengths, lam=1.0, pair_normalizer=1, token_normalizer=4)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(chosen.grad).all() and torch.isfinite(rejected.grad).all()


def test_kto_metrics_without_one_label_are_zero_on_the_inputs_device():
    policy = torch.tensor([-1.0, -2.0])
    _, metrics = kto_loss(policy, policy - 1, torch.tensor([True, True]), beta=0.1, reference_point=0.0, normalizer=2)
    assert float(metrics["rejected_reward"]) == 0.0 and metrics["rejected_reward"].device == policy.device
    assert float(metrics["chosen_reward"]) == pytest.approx(0.1)
