"""Off-policy corrections wired into training: the controller's step (``rl_steps.off_policy_corrected``) gives the
actor weights or a mask, and the actor's ``PolicyLoss`` with those weights is exactly the decoupled / truncated-IS
loss of ``algorithms.off_policy`` (checked against its token-level form), for every policy loss."""

from __future__ import annotations

import pytest
import torch

from hybridrl.algorithms import aggregate_loss
from hybridrl.algorithms.off_policy import decoupled_ppo_token_loss
from hybridrl.config.async_schema import OffPolicyCorrectionConfig
from hybridrl.config.schema import ActorConfig
from hybridrl.engines.losses import PolicyLoss, SequenceForward
from hybridrl.protocol import Batch, Fields
from hybridrl.trainers.rl_steps import off_policy_corrected

ROWS, RESPONSE = 6, 5


def rows(seed: int = 0) -> Batch:
    generator = torch.Generator().manual_seed(seed)
    mask = torch.ones(ROWS, RESPONSE, dtype=torch.long)
    for row, length in enumerate([5, 2, 4, 0, 1, 3]):
        mask[row, length:] = 0
    behaviour = -torch.rand(ROWS, RESPONSE, generator=generator) * 3
    proximal = behaviour + torch.randn(ROWS, RESPONSE, generator=generator) * 0.8
    return Batch({Fields.RESPONSE_MASK: mask, Fields.ROLLOUT_LOG_PROBS: behaviour * mask,
                  Fields.OLD_LOG_PROBS: proximal * mask,
                  Fields.ADVANTAGES: torch.randn(ROWS, RESPONSE, generator=generator)})


class FixedLogProbs(SequenceForward):
    """A forward whose log-probs are given (the loss under test is what happens after the model)."""

    def __init__(self, log_probs: torch.Tensor) -> None:
        object.__setattr__(self, "given", log_probs)

    def log_probs(self, model, batch, *, temperature, with_entropy=False, entropy_grad=False):
        return self.given, torch.zeros_like(self.given)


def policy_loss(batch: Batch, current: torch.Tensor, policy: str = "vanilla") -> torch.Tensor:
    actor = ActorConfig(policy_loss=policy)
    normalizer = batch[Fields.RESPONSE_MASK].sum().to(torch.float64)
    loss, _ = PolicyLoss(forward=FixedLogProbs(current), temperature=1.0, actor=actor)(None, batch, normalizer)
    return loss


def test_truncated_weights_in_the_policy_loss_are_decoupled_ppo():
    batch = rows()
    current = (batch[Fields.OLD_LOG_PROBS] + 0.3 * torch.randn(ROWS, RESPONSE,
                                                               generator=torch.Generator().manual_seed(1)))
    corrected, metrics = off_policy_corrected(batch, OffPolicyCorrectionConfig(kind="tis", cap=1.5))
    mask = batch[Fields.RESPONSE_MASK]
    expected = aggregate_loss(decoupled_ppo_token_loss(current, batch[Fields.OLD_LOG_PROBS],
                                                       batch[Fields.ROLLOUT_LOG_PROBS], batch[Fields.ADVANTAGES],
                                                       mask, 0.2, 0.2, behaviour_cap=1.5),
                              mask, "token-mean", mask.sum().to(torch.float64))
    # vanilla PPO's dual clip (A < 0, ratio > 3) is outside the decoupled reference: keep ratios below it
    assert float(torch.exp(current - batch[Fields.OLD_LOG_PROBS])[mask.bool()].max()) < 3.0
    assert torch.allclose(policy_loss(corrected, current), expected, atol=1e-7)
    assert not torch.allclose(policy_loss(batch, current), expected, atol=1e-4)  # the weights did something
    assert 0 < metrics["off_policy/fraction_corrected"] < 1 and metrics["off_policy/ratio_max"] > 1.5
    assert Fields.IS_WEIGHTS not in batch  # the controller's batch is left as it was


@pytest.mark.parametrize("policy", ["vanilla", "gspo", "cispo"])
def test_every_policy_loss_scales_exactly_with_a_constant_weight(policy):
    """Weights multiply the advantages; that is ``w × per-token loss`` only if each loss is positively homogeneous
    in the advantages — checked for each registered loss with a constant weight."""
    batch = rows(2)
    current = batch[Fields.OLD_LOG_PROBS] + 0.05
    weighted = Batch({**batch.tensors, Fields.IS_WEIGHTS: torch.full((ROWS, RESPONSE), 0.37)})
    assert torch.allclose(policy_loss(weighted, current, policy), 0.37 * policy_loss(batch, current, policy),
                          rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_masked_importance_drops_tokens_from_the_loss_and_its_normaliser(level):
    batch = rows(3)
    corrected, metrics = off_policy_corrected(batch, OffPolicyCorrectionConfig(kind="mis", low=0.7, high=1.4,
                                                                               level=level))
    ratio = torch.exp(batch[Fields.OLD_LOG_PROBS] - batch[Fields.ROLLOUT_LOG_PROBS])
    if level == "sequence":
        ratio = torch.exp(((batch[Fields.OLD_LOG_PROBS] - batch[Fields.ROLLOUT_LOG_PROBS])
                           * batch[Fields.RESPONSE_MASK]).sum(-1, keepdim=True)).expand(ROWS, RESPONSE)
    keep = batch[Fields.RESPONSE_MASK].bool() & (ratio >= 0.7) & (ratio <= 1.4)
    assert torch.equal(corrected[Fields.RESPONSE_MASK].bool(), keep)
    assert 0 < keep.sum() < batch[Fields.RESPONSE_MASK].sum()
    assert metrics["off_policy/fraction_corrected"] == pytest.approx(
        1 - float(keep.sum()) / float(batch[Fields.RESPONSE_MASK].sum()))


def test_no_correction_logs_the_ratio_and_changes_nothing():
    batch = rows(4)
    corrected, metrics = off_policy_corrected(batch, OffPolicyCorrectionConfig())
    assert corrected is batch and metrics["off_policy/fraction_corrected"] == 0.0
    mask = batch[Fields.RESPONSE_MASK].bool()
    ratio = torch.exp(batch[Fields.OLD_LOG_PROBS] - batch[Fields.ROLLOUT_LOG_PROBS])[mask]
    assert metrics["off_policy/ratio_max"] == pytest.approx(float(ratio.max()))
    assert metrics["off_policy/ratio_mean"] == pytest.approx(float(ratio.mean()))


def test_a_correction_without_rollout_log_probs_is_refused_naming_the_key():
    batch = rows().select(Fields.RESPONSE_MASK, Fields.OLD_LOG_PROBS, Fields.ADVANTAGES)
    with pytest.raises(ValueError, match="off_policy_correction.kind=tis needs the rollout engine's log-probs"):
        off_policy_corrected(batch, OffPolicyCorrectionConfig(kind="tis"))
    assert off_policy_corrected(batch, OffPolicyCorrectionConfig()) == (batch, {})


def test_auto_corrects_stale_samples_only():
    """``kind=auto`` (the default): truncated importance weights when the run trains on stale samples (an
    ``async_training`` bound > 0), nothing in a synchronous run."""
    batch, auto = rows(5), OffPolicyCorrectionConfig()
    assert auto.kind == "auto" and off_policy_corrected(batch, auto, staleness_bound=0)[0] is batch
    corrected, _ = off_policy_corrected(batch, auto, staleness_bound=2)
    explicit, _ = off_policy_corrected(batch, OffPolicyCorrectionConfig(kind="tis", cap=auto.cap))
    assert torch.equal(corrected[Fields.IS_WEIGHTS], explicit[Fields.IS_WEIGHTS])
