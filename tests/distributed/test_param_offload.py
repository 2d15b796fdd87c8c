"""``actor.fsdp.param_offload`` (FSDP2 CPUOffloadPolicy) trains to the same gradients as keeping parameters resident."""

from __future__ import annotations

import pytest
import torch
from gloo_spawn import run_on_gloo
from torch.distributed.device_mesh import init_device_mesh

from hybridrl.config.schema import ModelConfig
from hybridrl.utils.tiny_model import save_tiny_model
from hybridrl.modeling.fsdp import ShardingOptions, shard_model
from hybridrl.modeling.model_builder import build_model

pytestmark = pytest.mark.distributed


def gradients_with_and_without_offload(rank, world, model_dir, out_path):
    ids = torch.randint(4, 60, (2, 10), generator=torch.Generator().manual_seed(0))
    results = {}
    for offload in (False, True):
        model = build_model(ModelConfig(path=str(model_dir), dtype="float32"), "actor")
        shard_model(model, init_device_mesh("cpu", (world,)), ShardingOptions(param_offload=offload))
        model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
        results[offload] = {name: param.grad.full_tensor() for name, param in model.named_parameters()}
    if rank == 0:
        torch.save(results, out_path)


def test_param_offload_matches_resident_parameters(tmp_path):
    run_on_gloo(2, gradients_with_and_without_offload, save_tiny_model(tmp_path / "model"), tmp_path / "grads.pt")
    results = torch.load(tmp_path / "grads.pt", weights_only=True)
    for name, grad in results[False].items():
        assert torch.allclose(grad, results[True][name], atol=1e-6), name
