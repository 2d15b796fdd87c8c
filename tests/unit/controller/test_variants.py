"""DAPO's overlong shaping and dynamic-sampling group filter, and the batch plumbing they rely on."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hybridrl.config.schema import AlgorithmConfig, DataConfig, OverlongBufferConfig, TrainConfig
from hybridrl.trainers.variants import (GROUP_FILTERS, concat_rollouts, first_groups, group_filter, keep_groups,
                                          non_constant_score, num_groups, overlong_penalty, prompt_rows)
from hybridrl.protocol import Batch, Fields


def rollout(scores, lengths, prompt_width=3, response_width=6, uids=None):
    rows = len(scores)
    response_mask = torch.zeros(rows, response_width, dtype=torch.long)
    token_scores = torch.zeros(rows, response_width)
    for row, (score, length) in enumerate(zip(scores, lengths)):
        response_mask[row, :length] = 1
        token_scores[row, length - 1] = score
    prompts = torch.arange(rows * prompt_width).reshape(rows, prompt_width) + 10
    prompt_mask = torch.ones(rows, prompt_width, dtype=torch.long)
    responses = torch.full((rows, response_width), 2)
    return Batch(tensors={
        Fields.PROMPTS: prompts, Fields.RESPONSES: responses, Fields.RESPONSE_MASK: response_mask,
        Fields.INPUT_IDS: torch.cat([prompts, responses], 1), Fields.ATTENTION_MASK: torch.cat([prompt_mask, response_mask], 1),
        Fields.TOKEN_LEVEL_SCORES: token_scores,
    }, non_tensors={Fields.UID: uids or [f"g{row // 2}" for row in range(rows)], "ground_truth": ["1"] * rows})


def test_overlong_penalty_is_linear_in_the_buffer():
    config = TrainConfig(algorithm=AlgorithmConfig(overlong_buffer=OverlongBufferConfig(enable=True, len=4,
                                                                                      penalty_factor=1.0)),
                         data=DataConfig(max_response_length=6))
    batch = rollout([1.0, 1.0, 1.0, 0.0], [2, 3, 4, 6])  # buffer starts after 6 - 4 = 2 tokens
    shaped, metrics = overlong_penalty(batch, config)
    assert shaped.sum(-1).tolist() == pytest.approx([1.0, 0.75, 0.5, -1.0])
    assert metrics["reward/overlong_fraction"] == pytest.approx(0.75)


def test_dynamic_sampling_drops_constant_groups_and_refills():
    first = rollout([1, 0, 1, 1, 0, 0], [2] * 6)  # g0 mixed, g1 all 1, g2 all 0
    assert non_constant_score(first).tolist() == [True, False, False]
    kept = keep_groups(first, non_constant_score(first))
    second = rollout([0, 1, 1, 0], [3] * 4, prompt_width=5, uids=["h0", "h0", "h1", "h1"])
    merged = concat_rollouts([kept, second], pad_token_id=0)
    assert num_groups(merged) == 3 and merged[Fields.PROMPTS].shape[1] == 5
    assert merged[Fields.ATTENTION_MASK][:2, :2].sum() == 0  # the narrower prompts were left-padded
    assert list(first_groups(merged, 2)[Fields.UID]) == ["g0", "g0", "h0", "h0"]


def test_the_filter_metric_chooses_shaped_or_raw_scores():
    """Two responses both right (score 1), one of them cut by the overlong buffer: their sequence rewards differ
    (``seq_reward`` keeps the group), their reward-function scores do not (``score`` drops it)."""
    config = TrainConfig(algorithm=AlgorithmConfig(overlong_buffer=OverlongBufferConfig(enable=True, len=4)),
                         data=DataConfig(max_response_length=6))
    batch = rollout([1.0, 1.0, 1.0, 0.0], [2, 6, 2, 2])
    batch[Fields.SCORES] = batch[Fields.TOKEN_LEVEL_SCORES].sum(-1)
    batch[Fields.TOKEN_LEVEL_SCORES], _ = overlong_penalty(batch, config)
    assert GROUP_FILTERS["seq_reward"](batch).tolist() == [True, True]
    assert GROUP_FILTERS["score"](batch).tolist() == [False, True]
    assert GROUP_FILTERS["seq_final_reward"] is GROUP_FILTERS["seq_reward"]


def test_the_filter_metric_may_name_a_value_the_reward_function_returns():
    """verl's DAPO filters on ``acc``: scored through :class:`Scoring`, a reward function's ``{"score", "acc"}``
    puts ``acc`` on the rows, and groups whose ``acc`` differs are kept; a name it never returns is refused naming
    the key and what it does return."""
    from hybridrl.agents.batch import FINAL_RESPONSE
    from hybridrl.rewards import RewardScorer
    from hybridrl.trainers.evaluation import Scoring

    def reward_function(data_source, solution_str, ground_truth, extra_info=None):
        return {"score": 1.0, "acc": float(solution_str == ground_truth)}

    batch = rollout([0, 0, 0, 0], [2, 2, 2, 2])
    batch["data_source"], batch["extra_info"] = ["x"] * 4, [{}] * 4
    batch["ground_truth"], batch[FINAL_RESPONSE] = ["a", "a", "b", "b"], ["a", "c", "c", "c"]
    with RewardScorer(reward_function, num_workers=0) as scorer:
        scores, _, _ = Scoring(scorer, tokenizer=None).score(batch)
    assert scores.tolist() == [1.0] * 4 and batch["reward_extra/acc"].tolist() == [1.0, 0.0, 0.0, 0.0]
    assert group_filter("acc")(batch).tolist() == [True, False]  # every score is 1: only acc tells them apart
    with pytest.raises(ValueError, match=r"filter_groups.metric='pass': the reward function returned no number named "
                                         r"'pass' for any row \(it returns: acc\)"):
        group_filter("pass")(batch)


def test_prompt_rows_give_one_prompt_per_group():
    batch = rollout([1, 0, 1, 1], [2, 2, 3, 3])
    prompts, group_of_row = prompt_rows(batch)
    assert len(prompts) == 2 and group_of_row.tolist() == [0, 0, 1, 1]
    assert torch.equal(prompts[Fields.INPUT_IDS], batch[Fields.PROMPTS][[0, 2]])
    assert np.asarray(prompts["ground_truth"]).tolist() == ["1", "1"]


def test_refilled_groups_keep_their_routing_record_aligned():
    """MoE routing replay with dynamic sampling: a generation batch with narrower prompts is left-padded, and its
    routed_experts [B, T, routers, k] with it ("not recorded" in the new columns), so each token keeps its experts."""
    first, second = rollout([1, 0], [2, 2]), rollout([0, 1], [3, 3], prompt_width=5, uids=["h0", "h0"])
    for batch in (first, second):
        width = batch[Fields.INPUT_IDS].shape[1]
        batch[Fields.ROUTED_EXPERTS] = torch.arange(2 * width * 3 * 2, dtype=torch.int16).view(2, width, 3, 2)
    merged = concat_rollouts([first, second], pad_token_id=0)
    experts = merged[Fields.ROUTED_EXPERTS]
    assert experts.shape == (4, 11, 3, 2)
    assert bool((experts[:2, :2] == -1).all()) and torch.equal(experts[:2, 2:], first[Fields.ROUTED_EXPERTS])
    assert torch.equal(experts[2:], second[Fields.ROUTED_EXPERTS])
