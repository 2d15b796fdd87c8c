"""On-policy distillation's advantage (``hybridrl/algorithms/distillation.py``) against a slow per-token loop: the
task's advantage weighted, minus λ × each model token's reverse KL; observations and padding take none; and the
trainer's step adds it only when a teacher scored the batch."""

from __future__ import annotations

import pytest
import torch

from hybridrl.algorithms.distillation import distillation_advantages


def test_each_token_gets_its_own_reverse_kl_next_to_the_task_advantage():
    generator = torch.Generator().manual_seed(0)
    task = torch.randn(3, 5, generator=generator)
    student, teacher = -torch.rand(3, 5, generator=generator) * 4, -torch.rand(3, 5, generator=generator) * 4
    mask = torch.tensor([[1, 1, 0, 1, 0], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0]])  # an observation; a failed episode
    advantages, metrics = distillation_advantages(task, student, teacher, mask, kl_coef=0.5, task_weight=2.0)
    kls = []
    for row in range(3):
        for position in range(5):
            if mask[row, position]:
                kl = float(student[row, position] - teacher[row, position])
                kls.append(kl)
                expected = 2.0 * float(task[row, position]) - 0.5 * kl
            else:
                expected = 0.0
            assert float(advantages[row, position]) == pytest.approx(expected, abs=1e-6)
    assert metrics["distill/reverse_kl_per_token"] == pytest.approx(sum(kls) / len(kls), abs=1e-6)
    per_sequence = [sum(kls[:3]), sum(kls[3:])]
    assert metrics["distill/reverse_kl_per_sequence"] == pytest.approx(sum(per_sequence) / 2, abs=1e-5)


def test_without_a_teacher_the_advantages_are_the_tasks():
    from hybridrl.config.algorithm_schema import DistillationConfig
    from hybridrl.protocol import Batch, Fields
    from hybridrl.trainers.rl_steps import with_distillation

    advantages = torch.randn(2, 3)
    batch = Batch(tensors={Fields.RESPONSE_MASK: torch.ones(2, 3, dtype=torch.long),
                           Fields.OLD_LOG_PROBS: -torch.ones(2, 3), Fields.TEACHER_LOG_PROBS: -2 * torch.ones(2, 3)})
    metrics = {}
    assert with_distillation(batch, advantages, DistillationConfig(), metrics) is advantages and metrics == {}
    shaped = with_distillation(batch, advantages, DistillationConfig(teacher_path="t", kl_coef=1.0, task_weight=0.0),
                               metrics)
    assert torch.allclose(shaped, -torch.ones(2, 3)) and metrics["distill/reverse_kl_per_token"] == pytest.approx(1.0)
