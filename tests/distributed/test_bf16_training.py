"""bf16 compute (FSDP2 mixed precision, fp32 master weights and reduction) on 2 gloo ranks, with tied embeddings:
runs, and its gradient stays close to the fp32 single-process reference."""

from __future__ import annotations

import pytest
import torch
from gloo_spawn import run_on_gloo
from torch.distributed.device_mesh import init_device_mesh
from transformers import AutoModelForCausalLM

from hybridrl.config.schema import ModelConfig
from hybridrl.protocol import Batch
from hybridrl.utils.tiny_model import TinyModelSpec, save_tiny_model
from hybridrl.engines.base import TrainingEngine
from hybridrl.engines.losses import PolicyLoss, SequenceForward
from hybridrl.engines.micro_batches import DataParallelGroup, MicroBatching
from hybridrl.modeling.fsdp import ShardingOptions, shard_model
from hybridrl.modeling.model_builder import build_model

pytestmark = pytest.mark.distributed


def make_batch():
    generator = torch.Generator().manual_seed(0)
    mask = torch.ones(4, 10, dtype=torch.long)
    mask[0, :2] = 0
    mask[3, -2:] = 0
    return {"input_ids": torch.randint(4, 60, (4, 10), generator=generator) * mask, "attention_mask": mask,
            "response_mask": mask[:, -4:].clone(), "old_log_probs": -torch.rand(4, 4, generator=generator) * 4,
            "advantages": torch.randn(4, 4, generator=generator)}


LOSS = PolicyLoss(forward=SequenceForward(), temperature=1.0, loss_scale_factor=4.0)


def bf16_gradients(rank, world, model_dir, out_path):
    model = build_model(ModelConfig(path=str(model_dir), dtype="bfloat16"), "actor")
    shard_model(model, init_device_mesh("cpu", (world,)), ShardingOptions(compute_dtype=torch.bfloat16))
    data = make_batch()
    local = Batch(tensors={name: tensor[rank * 2:(rank + 1) * 2] for name, tensor in data.items()})
    engine = TrainingEngine(model, dp=DataParallelGroup(rank=rank, size=world),
                            micro_batching=MicroBatching(micro_batch_size=1))
    engine.accumulate_gradients(local, LOSS)
    grads = {name: param.grad.full_tensor() for name, param in model.named_parameters()}
    assert all(grad.dtype == torch.float32 for grad in grads.values())  # fp32 master gradients
    if rank == 0:
        torch.save(grads, out_path)


def test_bf16_mixed_precision_with_tied_embeddings(tmp_path):
    model_dir = save_tiny_model(tmp_path / "model", TinyModelSpec(tie_word_embeddings=True))
    run_on_gloo(2, bf16_gradients, model_dir, tmp_path / "bf16.pt")
    bf16 = torch.load(tmp_path / "bf16.pt", weights_only=True)
    reference = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    engine = TrainingEngine(reference, dp=DataParallelGroup(), micro_batching=MicroBatching(micro_batch_size=4))
    engine.accumulate_gradients(Batch(tensors=make_batch()), LOSS)
    expected = {name: param.grad for name, param in reference.named_parameters()}
    numerator = sum(float((bf16[name] - grad).pow(2).sum()) for name, grad in expected.items())
    denominator = sum(float(grad.pow(2).sum()) for grad in expected.values())
    assert (numerator / denominator) ** 0.5 < 0.05  # bf16 compute: close, not exact
