"""A distributed checkpoint saved with one DP size loads into another (2 → 1 and 1 → 2): same weights, Adam state and
learning-rate schedule on every rank."""

from __future__ import annotations

import pytest
import torch
from gloo_spawn import run_on_gloo
from torch.distributed.device_mesh import init_device_mesh

from hybridrl.config.schema import ModelConfig, OptimConfig
from hybridrl.utils.tiny_model import save_tiny_model
from hybridrl.engines.checkpoint import full_state_dict, load_sharded, save_sharded
from hybridrl.modeling.fsdp import ShardingOptions, shard_model
from hybridrl.modeling.model_builder import build_model
from hybridrl.engines.optim import build_optimizer, build_scheduler

pytestmark = pytest.mark.distributed


def sharded_actor(model_dir, world):
    model = build_model(ModelConfig(path=str(model_dir), dtype="float32"), "actor")
    shard_model(model, init_device_mesh("cpu", (world,)), ShardingOptions())
    optimizer = build_optimizer(model, OptimConfig(lr=1e-2))
    return model, optimizer, build_scheduler(optimizer, OptimConfig(lr=1e-2), total_steps=10)


def adam_moments(model, optimizer):
    return {name: optimizer.state[param]["exp_avg"].full_tensor() for name, param in model.named_parameters()}


def train_and_save(rank, world, model_dir, checkpoint, reference_path):
    model, optimizer, scheduler = sharded_actor(model_dir, world)
    ids = torch.arange(4 * 6).reshape(4, 6) % 50 + 4
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    scheduler.step()
    save_sharded(checkpoint, model, optimizer, scheduler)
    weights, moments = full_state_dict(model), adam_moments(model, optimizer)
    if rank == 0:
        torch.save({"weights": weights, "moments": moments, "lr": scheduler.get_last_lr()}, reference_path)


def load_and_compare(rank, world, model_dir, checkpoint, reference_path, out_path):
    model, optimizer, scheduler = sharded_actor(model_dir, world)
    load_sharded(checkpoint, model, optimizer, scheduler)
    weights, moments = full_state_dict(model), adam_moments(model, optimizer)
    learning_rates = [None] * world
    torch.distributed.all_gather_object(learning_rates, scheduler.get_last_lr())
    assert all(lr == learning_rates[0] for lr in learning_rates)  # every rank restored the same schedule
    if rank == 0:
        torch.save({"weights": weights, "moments": moments, "lr": scheduler.get_last_lr()}, out_path)


@pytest.mark.parametrize(("save_world", "load_world"), [(2, 1), (1, 2)])
def test_checkpoint_loads_at_another_dp_size(tmp_path, save_world, load_world):
    model_dir = save_tiny_model(tmp_path / "model")
    checkpoint, reference, loaded = tmp_path / "ckpt", tmp_path / "reference.pt", tmp_path / "loaded.pt"
    run_on_gloo(save_world, train_and_save, model_dir, checkpoint, reference)
    run_on_gloo(load_world, load_and_compare, model_dir, checkpoint, reference, loaded)
    expected, actual = torch.load(reference, weights_only=True), torch.load(loaded, weights_only=True)
    assert expected["weights"].keys() == actual["weights"].keys()
    for name, tensor in expected["weights"].items():
        assert torch.equal(tensor, actual["weights"][name]), name
    for name, tensor in expected["moments"].items():
        assert torch.equal(tensor, actual["moments"][name]), name
    assert expected["lr"] == actual["lr"]
    fresh = build_model(ModelConfig(path=str(model_dir)), "actor").state_dict()
    assert not torch.equal(fresh["lm_head.weight"], actual["weights"]["lm_head.weight"])  # it did train
