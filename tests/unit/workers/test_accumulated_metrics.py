"""Logged metrics describe the mini-batch, whatever the micro-batching: the loss is summed, the rest averaged."""

from __future__ import annotations

import pytest
import torch

from hybridrl.config.schema import ModelConfig
from hybridrl.protocol import Batch
from hybridrl.utils.tiny_model import save_tiny_model
from hybridrl.engines.base import TrainingEngine
from hybridrl.engines.losses import PolicyLoss, SequenceForward
from hybridrl.engines.micro_batches import DataParallelGroup, MicroBatching
from hybridrl.modeling.model_builder import build_model


def test_logged_loss_does_not_depend_on_micro_batching(tmp_path):
    model = build_model(ModelConfig(path=str(save_tiny_model(tmp_path / "m")), dtype="float32"), "actor")
    engine = TrainingEngine(model, dp=DataParallelGroup())
    generator = torch.Generator().manual_seed(0)
    mask = torch.ones(8, 9, dtype=torch.long)
    mask[::2, -2:] = 0
    batch = Batch(tensors={"input_ids": torch.randint(4, 60, (8, 9), generator=generator) * mask,
                           "attention_mask": mask, "response_mask": mask[:, -4:].clone(),
                           "old_log_probs": -torch.rand(8, 4, generator=generator) * 4,
                           "advantages": torch.randn(8, 4, generator=generator)})
    loss = PolicyLoss(forward=SequenceForward(), temperature=1.0, loss_scale_factor=4.0)
    logged = []
    for size in (8, 4, 1):
        model.zero_grad()
        engine.micro_batching = MicroBatching(micro_batch_size=size)
        metrics = engine.accumulate_gradients(batch, loss)
        logged.append((metrics["pg_loss"], metrics["entropy"], metrics["pg_clipfrac"]))
    for values in logged[1:]:
        assert values == pytest.approx(logged[0], rel=1e-5, abs=1e-7)
    assert logged[0][0] != 0.0
