"""``*.fsdp.optimizer_offload`` is exact: a value model (the critic's, FSDP2 over 2 gloo ranks) whose AdamW state
leaves for new storage after every step and comes back before the next trains to the same weights, bit for bit, as one
whose state never moves. On CPU the round trip is forced into new storage (``copy_on_cpu``); the move to the host
and back on a GPU is tests/gpu/test_offload_gpu.py."""

from __future__ import annotations

import pytest
import torch
from gloo_spawn import run_on_gloo
from torch.distributed.device_mesh import init_device_mesh

from hybridrl.config.schema import ModelConfig, OptimConfig
from hybridrl.engines.offload import OptimizerOffload
from hybridrl.engines.optim import build_optimizer
from hybridrl.modeling.fsdp import ShardingOptions, shard_model
from hybridrl.modeling.model_builder import build_model
from hybridrl.utils.tiny_model import save_tiny_model

pytestmark = pytest.mark.distributed
STEPS = 3


def train_critic(rank: int, world: int, model_dir, out_path) -> None:
    ids = torch.randint(4, 60, (2, 10), generator=torch.Generator().manual_seed(rank))
    results = {}
    for offloaded in (False, True):
        torch.manual_seed(0)  # the same fresh value head on both sides
        model = build_model(ModelConfig(path=str(model_dir), dtype="float32"), "critic")
        shard_model(model, init_device_mesh("cpu", (world,)), ShardingOptions())
        optimizer = build_optimizer(model, OptimConfig(lr=1e-2, weight_decay=0.01))
        offload = OptimizerOffload(optimizer, torch.device("cpu"), enabled=offloaded, copy_on_cpu=True)
        storages = []
        for _ in range(STEPS):
            with offload.resident():
                values = model(input_ids=ids).logits.squeeze(-1)
                values.square().mean().backward()
                optimizer.step()
                optimizer.zero_grad()
            storages.append([state["exp_avg"] for state in optimizer.state.values()])  # kept: no address reuse
        pointers = [{moment.to_local().data_ptr() for moment in step if moment.to_local().numel()}  # a rank's shard
                    for step in storages]  # of the 1-row value head may be empty
        moved = all(a.isdisjoint(b) for a, b in zip(pointers, pointers[1:]))
        assert moved is offloaded, "the state must move to new storage every step with offload, and only then"
        results[offloaded] = {name: param.full_tensor() for name, param in model.named_parameters()}
    if rank == 0:
        torch.save(results, out_path)


def test_an_offloaded_critic_optimizer_trains_to_the_same_weights(tmp_path):
    run_on_gloo(2, train_critic, save_tiny_model(tmp_path / "model"), tmp_path / "weights.pt")
    results = torch.load(tmp_path / "weights.pt", weights_only=True)
    assert results[False].keys() == results[True].keys()
    for name, weight in results[False].items():
        assert torch.equal(weight, results[True][name]), name
