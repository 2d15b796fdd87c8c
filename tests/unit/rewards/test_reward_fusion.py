"""Reward fusion against slow references: running statistics, weighted normalised sum with a cap, guards."""

from __future__ import annotations

import pytest
import torch

from hybridrl.rewards.fusion import (
    RunningMeanStd,
    diversity_penalty,
    fuse_rewards,
    length_penalty,
    text_similarity,
)


def test_running_statistics_equal_the_statistics_of_everything_seen():
    generator = torch.Generator().manual_seed(0)
    batches = [torch.randn(size, generator=generator) * 3 + 1 for size in (5, 1, 17, 8)]
    stats = RunningMeanStd()
    for batch in batches:
        stats.update(batch)
    everything = torch.cat(batches).double()
    assert stats.count == 31
    assert stats.mean == pytest.approx(float(everything.mean()), rel=1e-12)
    assert stats.std == pytest.approx(float(everything.std(unbiased=False)), rel=1e-12)
    restored = RunningMeanStd()
    restored.load_state_dict(stats.state_dict())
    assert restored.normalize(torch.tensor([2.0])).item() == pytest.approx((2 - stats.mean) / stats.std)


def test_fusion_is_the_weighted_sum_of_normalised_components_capped():
    rule = torch.tensor([1.0, 0.0, 1.0, 0.0])
    rm_batches = [torch.tensor([10.0, 12.0, 8.0, 14.0]), torch.tensor([20.0, 11.0, 9.0, 10.0])]
    normalizers = {"rm": RunningMeanStd()}
    seen = []
    for rm in rm_batches:
        fused, metrics = fuse_rewards({"rule": rule, "rm": rm}, {"rule": 2.0, "rm": 0.5}, normalizers=normalizers,
                                      cap=1.5)
        seen.append(rm)
        history = torch.cat(seen)
        mean, std = float(history.mean()), float(history.std(unbiased=False))
        expected = [min(2.0 * r + 0.5 * (m - mean) / std, 1.5) for r, m in zip(rule.tolist(), rm.tolist())]
        assert fused.tolist() == pytest.approx(expected, rel=1e-5)
        assert metrics["reward/rm/mean"] == pytest.approx(float(rm.mean()))
        assert metrics["reward/capped_fraction"] == sum(1.0 for value in expected if value == 1.5) / 4


def test_fusion_refuses_a_component_without_weight():
    with pytest.raises(ValueError, match=r"\['rm'\] have no weight"):
        fuse_rewards({"rule": torch.zeros(2), "rm": torch.zeros(2)}, {"rule": 1.0})


def test_length_penalty_is_linear_in_length():
    assert length_penalty(torch.tensor([0, 4, 8]), 8, 0.5).tolist() == [0.0, -0.25, -0.5]


def test_diversity_penalty_is_the_mean_similarity_to_group_mates():
    texts = ["12", "12", "345", "12", "99"]
    groups = ["a", "a", "a", "b", "c"]
    penalties = diversity_penalty(texts, groups, coef=2.0)
    slow = []
    for row, (text, group) in enumerate(zip(texts, groups)):
        mates = [text_similarity(text, other) for j, (other, g) in enumerate(zip(texts, groups)) if g == group and j != row]
        slow.append(-2.0 * sum(mates) / len(mates) if mates else 0.0)
    assert penalties.tolist() == pytest.approx(slow)
    assert penalties[0] == pytest.approx(-2.0 * (1.0 + 0.0) / 2)  # one identical mate, one disjoint
    assert penalties[3] == 0.0  # alone in its group
    assert text_similarity("abcd", "abce") == pytest.approx(2 / 4)


def test_fused_scoring_state_round_trips_the_normalisers():
    from hybridrl.config import load_config
    from hybridrl.trainers.reward_fusion import FusedScoring

    config = load_config(["reward_fusion.enable=true", "reward_fusion.normalize=[rule]"], check_paths=False)
    first, second = FusedScoring(None, config), FusedScoring(None, config)
    first.normalizers["rule"].update(torch.tensor([0.0, 1.0, 1.0]))
    second.load_state_dict(first.state_dict())
    assert second.normalizers["rule"].state_dict() == first.normalizers["rule"].state_dict()


def test_dynamic_weighting_divides_each_weight_by_the_running_std_of_its_raw_component():
    rule_batches = [torch.tensor([1.0, 0.0, 0.0, 0.0]), torch.tensor([1.0, 1.0, 0.0, 1.0])]
    rm_batches = [torch.tensor([30.0, -10.0, 50.0, 0.0]), torch.tensor([5.0, 7.0, 6.0, 9.0])]
    scales = {"rule": RunningMeanStd(), "rm": RunningMeanStd()}
    seen_rule, seen_rm = [], []
    for rule, rm in zip(rule_batches, rm_batches):
        fused, metrics = fuse_rewards({"rule": rule, "rm": rm}, {"rule": 1.0, "rm": 0.5}, scales=scales)
        seen_rule.append(rule)
        seen_rm.append(rm)
        rule_std = float(torch.cat(seen_rule).std(unbiased=False))
        rm_std = float(torch.cat(seen_rm).std(unbiased=False))
        expected = [r / rule_std + 0.5 * m / rm_std for r, m in zip(rule.tolist(), rm.tolist())]
        assert fused.tolist() == pytest.approx(expected, rel=1e-5)
        assert metrics["reward/rm/weight"] == pytest.approx(0.5 / rm_std)
    # the reward model's 20x larger spread no longer drowns the rule score: both terms now have comparable spread
    assert abs(metrics["reward/rule/weight"] * rule_std - 1.0) < 1e-9


def test_dynamic_weighting_keeps_the_weight_until_there_is_a_spread():
    scales = {"rule": RunningMeanStd()}
    fused, metrics = fuse_rewards({"rule": torch.tensor([1.0])}, {"rule": 2.0}, scales=scales)
    assert fused.tolist() == [2.0] and metrics["reward/rule/weight"] == 2.0


def test_fused_scoring_saves_the_dynamic_weighting_statistics():
    from hybridrl.config import load_config
    from hybridrl.trainers.reward_fusion import FusedScoring

    config = load_config(["reward_fusion.enable=true", "reward_fusion.weighting=inverse_std"], check_paths=False)
    first, second = FusedScoring(None, config), FusedScoring(None, config)
    first.scales["rule"].update(torch.tensor([0.0, 1.0, 1.0]))
    second.load_state_dict(first.state_dict())
    assert second.scales["rule"].state_dict() == first.scales["rule"].state_dict()
