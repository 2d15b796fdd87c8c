"""The controller's tensor steps: KL in the reward, advantages through the registry, DP balancing, batch metrics."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hybridrl.config.schema import AlgorithmConfig
from hybridrl.trainers.rl_steps import apply_kl_in_reward, balance_batch, batch_metrics, compute_advantages
from hybridrl.protocol import Batch, Fields
from hybridrl.trainers.async_rollout import with_current_field_names


def rollout_batch(rows=8, width=5, seed=0) -> Batch:
    generator = torch.Generator().manual_seed(seed)
    response_mask = torch.zeros(rows, width, dtype=torch.long)
    for row in range(rows):
        response_mask[row, : 1 + row % width] = 1
    prompt_mask = torch.ones(rows, 3, dtype=torch.long)
    scores = torch.zeros(rows, width)
    scores[torch.arange(rows), response_mask.sum(-1) - 1] = torch.randint(0, 2, (rows,), generator=generator).float()
    return Batch(tensors={
        Fields.RESPONSES: torch.randint(4, 50, (rows, width), generator=generator),
        Fields.RESPONSE_MASK: response_mask,
        Fields.ATTENTION_MASK: torch.cat([prompt_mask, response_mask], dim=-1),
        Fields.TOKEN_LEVEL_SCORES: scores,
        Fields.OLD_LOG_PROBS: -torch.rand(rows, width, generator=generator),
        Fields.REF_LOG_PROBS: -torch.rand(rows, width, generator=generator),
    }, non_tensors={Fields.UID: [f"p{row // 4}" for row in range(rows)]})


def test_kl_in_reward_subtracts_coefficient_times_kl_per_token():
    batch = rollout_batch()
    penalised = apply_kl_in_reward(batch, kl_coef=0.5, kind="k1")
    rewards, metrics = penalised.rewards, penalised.metrics()
    mask = batch[Fields.RESPONSE_MASK]
    kl = (batch[Fields.OLD_LOG_PROBS] - batch[Fields.REF_LOG_PROBS]) * mask
    assert torch.allclose(rewards, batch[Fields.TOKEN_LEVEL_SCORES] - 0.5 * kl)
    per_sequence = (kl.sum(-1) / mask.sum(-1)).mean()
    assert metrics["actor/reward_kl_penalty"] == pytest.approx(float(per_sequence))
    assert penalised.mean_sequence_kl == metrics["actor/reward_kl_penalty"] and penalised.coef == 0.5


def test_grpo_advantages_use_uid_groups():
    batch = rollout_batch()
    batch[Fields.TOKEN_LEVEL_REWARDS] = batch[Fields.TOKEN_LEVEL_SCORES]
    advantages, _ = compute_advantages(batch, AlgorithmConfig(adv_estimator="grpo"))
    scores = batch[Fields.TOKEN_LEVEL_SCORES].sum(-1)
    for group in (slice(0, 4), slice(4, 8)):
        group_scores = scores[group]
        expected = (group_scores - group_scores.mean()) / (group_scores.std() + 1e-6)
        first_token = advantages[group, 0]
        assert torch.allclose(first_token, expected, atol=1e-5)


def test_balance_batch_evens_tokens_and_keeps_rows():
    batch = rollout_batch(rows=8)
    balanced = balance_batch(batch, num_ranks=2)
    tokens = balanced[Fields.ATTENTION_MASK].sum(-1)
    halves = [int(tokens[:4].sum()), int(tokens[4:].sum())]
    original = batch[Fields.ATTENTION_MASK].sum(-1)
    assert abs(halves[0] - halves[1]) <= int(original.max())
    assert sorted(balanced[Fields.RESPONSES].tolist()) == sorted(batch[Fields.RESPONSES].tolist())
    assert balance_batch(batch, 1) is batch


def test_batch_metrics_report_scores_lengths_and_rollout_gap():
    batch = rollout_batch()
    batch[Fields.TOKEN_LEVEL_REWARDS] = batch[Fields.TOKEN_LEVEL_SCORES]
    batch[Fields.ADVANTAGES] = torch.ones(8, 5)
    batch[Fields.ROLLOUT_LOG_PROBS] = batch[Fields.OLD_LOG_PROBS] + 0.25
    metrics = batch_metrics(batch)
    assert metrics["critic/score/mean"] == pytest.approx(float(batch[Fields.TOKEN_LEVEL_SCORES].sum(-1).mean()))
    assert metrics["response_length/mean"] == pytest.approx(float(np.mean([1 + r % 5 for r in range(8)])))
    assert metrics["rollout/log_prob_diff_max"] == pytest.approx(0.25, abs=1e-6)


def test_rows_saved_under_the_old_version_names_are_read_back_under_policy_version():
    """An async checkpoint written before the one ``policy_version`` holds its rows' versions as ``weight_version``
    and ``token_weight_versions``; resuming moves them to the current names, values unchanged."""
    rows = with_current_field_names(Batch({"weight_version": torch.tensor([2, 3]),
                                           "token_weight_versions": torch.tensor([[2, 3], [3, -1]])}))
    assert set(rows.keys()) == {Fields.POLICY_VERSION, Fields.TOKEN_POLICY_VERSIONS}
    assert rows.policy_version.tolist() == [2, 3] and rows.token_policy_versions.tolist() == [[2, 3], [3, -1]]
