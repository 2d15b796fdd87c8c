"""A plugin file: new components registered by name, chosen from the config like the built-in ones.

    hybridrl train --config-name demo_grpo trainer.plugins=[recipes/plugin_example.py] \
        algorithm.adv_estimator=grpo_rank rollout.name=hf_capped

``trainer.plugins`` runs this file in the controller before the config is validated (so the two names below are
accepted) and in every worker process before it builds anything (so the actor worker finds ``hf_capped``).

- ``grpo_rank``: a group-relative advantage from *ranks* instead of raw scores — each response's score is replaced
  by its centred rank in its group, scaled to [-1, 1], so one outlier reward cannot dominate the update.
- ``hf_capped``: the HF rollout (generating with the actor's own module, so nothing to sync) with every response
  cut at ``CAPPED_NEW_TOKENS`` tokens — e.g. to warm a policy up on short answers.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from hybridrl.algorithms import ADVANTAGE_ESTIMATORS, group_ids
from hybridrl.algorithms.masked import masked_sum
from hybridrl.rollout import ROLLOUT_ENGINES
from hybridrl.rollout.hf import HFRollout

CAPPED_NEW_TOKENS = 2


@ADVANTAGE_ESTIMATORS.register("grpo_rank")
@torch.no_grad()
def rank_advantages(*, token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index, **unused):
    """``[B, R]`` advantages: ``2 · (rank − mean rank) / (group size − 1)`` of each row's score within its group (ties
    share their mean rank), on every valid token; a group of one gets 0. Returns ``(advantages, advantages)``."""
    scores = masked_sum(token_level_rewards, response_mask, dim=-1)
    groups = group_ids(index, scores.shape[0], scores.device)
    advantages = torch.zeros_like(scores)
    for group in groups.unique():
        rows = (groups == group).nonzero().flatten()
        if len(rows) < 2:
            continue
        group_scores = scores[rows]
        below = (group_scores.unsqueeze(1) > group_scores.unsqueeze(0)).sum(1).float()
        ties = (group_scores.unsqueeze(1) == group_scores.unsqueeze(0)).sum(1).float()
        rank = below + (ties - 1) / 2  # 0 .. size-1, ties averaged
        advantages[rows] = 2 * (rank - (len(rows) - 1) / 2) / (len(rows) - 1)
    per_token = advantages.unsqueeze(-1) * response_mask
    return per_token, per_token


@ROLLOUT_ENGINES.register("hf_capped")
class CappedHFRollout(HFRollout):
    """HF generation on the actor's module, responses cut at :data:`CAPPED_NEW_TOKENS` (the layout keeps the width
    the trainer asked for; the positions after the cap are padding)."""

    generates_with_actor_module = True  # the capability the actor worker reads: no weight sync

    def generate(self, prompts, params):
        capped = super().generate(prompts, replace(params, max_new_tokens=min(params.max_new_tokens,
                                                                              CAPPED_NEW_TOKENS)))
        width = params.max_new_tokens - capped["responses"].shape[1]
        if width == 0:
            return capped
        return pad_responses(capped, width, self.pad_token_id)


def pad_responses(rollout, width: int, pad_token_id: int):
    """``rollout`` with ``width`` more response columns of padding (mask 0, log-prob 0)."""
    from hybridrl.protocol import Batch, Fields

    def wider(tensor, value):
        return torch.cat([tensor, torch.full((len(tensor), width), value, dtype=tensor.dtype)], dim=1)

    tensors = dict(rollout.tensors)
    tensors[Fields.RESPONSES] = wider(tensors[Fields.RESPONSES], pad_token_id)
    tensors[Fields.RESPONSE_MASK] = wider(tensors[Fields.RESPONSE_MASK], 0)
    tensors[Fields.ROLLOUT_LOG_PROBS] = wider(tensors[Fields.ROLLOUT_LOG_PROBS], 0)
    tensors[Fields.INPUT_IDS] = wider(tensors[Fields.INPUT_IDS], pad_token_id)
    tensors[Fields.ATTENTION_MASK] = wider(tensors[Fields.ATTENTION_MASK], 0)
    return Batch(tensors=tensors, non_tensors=dict(rollout.non_tensors), meta=rollout.meta)
