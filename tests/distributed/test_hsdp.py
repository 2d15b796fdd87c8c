"""HSDP (``*.fsdp.fsdp_size``): 4 gloo ranks sharding in 2 groups of 2 and replicating across them train exactly as
plain FSDP2 over all 4 — the same gradients and the same parameters after AdamW steps — while each rank holds half
the model instead of a quarter.

The two reduce the same four per-rank gradients in a different order (plain: one reduce-scatter over 4 ranks; HSDP:
a reduce-scatter over 2, then an all-reduce across the 2 groups), so in float32 they differ by the rounding of a
4-term sum (~1 ulp; Adam then amplifies it on near-zero components). Reduced in float64 — where the sum of four
float32 gradients is exact here, whatever the order — every gradient and every parameter is bit-identical: the
reductions compute the same thing. The float32 case is checked against that rounding bound."""

from __future__ import annotations

import pytest
import torch
from gloo_spawn import run_on_gloo
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from hybridrl.config.schema import ModelConfig, OptimConfig
from hybridrl.engines.checkpoint import load_sharded, save_sharded
from hybridrl.engines.optim import build_optimizer
from hybridrl.modeling.fsdp import ShardingOptions, shard_model
from hybridrl.modeling.model_builder import build_model
from hybridrl.utils.distributed import full_tensor, sharding_mesh
from hybridrl.utils.tiny_model import save_tiny_model

pytestmark = pytest.mark.distributed

WORLD, STEPS = 4, 2
CASES = [(reduce_dtype, fsdp_size) for reduce_dtype in (torch.float64, torch.float32) for fsdp_size in (-1, 2)]


def train_both_ways(rank, world, model_dir, out_path):
    """Each rank trains on its own rows; FSDP2 averages the gradients over all ranks either way (the usual ×world
    loss scaling cancels the average, as in the engine)."""
    generator = torch.Generator().manual_seed(100 + rank)
    rows = [torch.randint(4, 60, (2, 12), generator=generator) for _ in range(STEPS)]
    results = {}
    for reduce_dtype, fsdp_size in CASES:
        torch.manual_seed(0)
        model = build_model(ModelConfig(path=str(model_dir), dtype="float32"), "actor")
        shard_model(model, init_device_mesh("cpu", (world,)),
                    ShardingOptions(reduce_dtype=reduce_dtype, shard_group_size=fsdp_size))
        optimizer = build_optimizer(model, OptimConfig(lr=1e-2, weight_decay=0.01))
        local_numel = sum(param.to_local().numel() for param in model.parameters())
        gradients = []
        for ids in rows:
            (model(input_ids=ids, labels=ids, use_cache=False).loss * world).backward()
            gradients.append({name: full_tensor(param.grad).clone() for name, param in model.named_parameters()})
            optimizer.step()
            optimizer.zero_grad()
        params = {name: full_tensor(param.detach()).clone() for name, param in model.named_parameters()}
        placements = {str(param.placements) for param in model.parameters()}
        results[str(reduce_dtype), fsdp_size] = dict(gradients=gradients, params=params, local_numel=local_numel, placements=placements)
    if rank == 0:
        torch.save(results, out_path)


def test_hsdp_trains_exactly_as_fsdp2_over_all_ranks(tmp_path):
    run_on_gloo(WORLD, train_both_ways, save_tiny_model(tmp_path / "model"), tmp_path / "out.pt")
    results = torch.load(tmp_path / "out.pt", weights_only=False)
    plain, hsdp = results[str(torch.float64), -1], results[str(torch.float64), 2]
    assert hsdp["placements"] == {"(Replicate(), Shard(dim=0))"} and plain["placements"] == {"(Shard(dim=0),)"}
    total = sum(param.numel() for param in plain["params"].values())
    assert plain["local_numel"] <= total // WORLD + 64 < hsdp["local_numel"] <= total // 2 + 64  # 1/4 vs 1/2
    for step in range(STEPS):
        for name, grad in plain["gradients"][step].items():
            assert torch.equal(grad, hsdp["gradients"][step][name]), (step, name)
    for name, param in plain["params"].items():
        assert torch.equal(param, hsdp["params"][name]), name
    # float32: the first step's gradients (before Adam amplifies anything) agree to the rounding of a 4-term sum
    plain32, hsdp32 = results[str(torch.float32), -1], results[str(torch.float32), 2]
    for name, grad in plain32["gradients"][0].items():
        bound = 4 * torch.finfo(torch.float32).eps * plain["gradients"][0][name].abs().max()
        assert (grad - hsdp32["gradients"][0][name]).abs().max() <= bound, name
        assert (grad - plain["gradients"][0][name]).abs().max() <= bound, name  # and the exact sum, too


def accumulate_both_ways(rank, world, model_dir, out_path):
    """Two micro-batches per optimizer step through the engine's gradient-sync settings: plain FSDP2 reducing once
    (``grad_sync=step``) against HSDP reduce-scattering after each (``micro_batch``) with its all-reduce across the
    groups deferred to the last; float64 reductions, so any order gives the same sum."""
    from hybridrl.modeling.fsdp import set_gradient_sync, syncs_gradients
    from hybridrl.utils.collectives import CollectiveCounter, CollectiveTimer

    generator = torch.Generator().manual_seed(200 + rank)
    micro_batches = [torch.randint(4, 60, (1, 12), generator=generator) for _ in range(2)]
    results = {}
    for fsdp_size, grad_sync in ((-1, "step"), (2, "micro_batch")):
        torch.manual_seed(0)
        model = build_model(ModelConfig(path=str(model_dir), dtype="float32"), "actor")
        shard_model(model, init_device_mesh("cpu", (world,)),
                    ShardingOptions(reduce_dtype=torch.float64, shard_group_size=fsdp_size))
        with CollectiveCounter() as outer, CollectiveTimer() as comm:  # nested, as a worker call around an update
            for index, ids in enumerate(micro_batches):
                set_gradient_sync(model, syncs_gradients(grad_sync, index, 2), all_reduce=index == 1)
                (model(input_ids=ids, labels=ids, use_cache=False).loss * world).backward()
        results[fsdp_size] = dict(gradients={name: full_tensor(param.grad).clone()
                                             for name, param in model.named_parameters()},
                                  reduced=dict(comm.payload_bytes), outer=dict(outer.payload_bytes))
    if rank == 0:
        torch.save(results, out_path)


def test_hsdp_all_reduces_once_per_step_when_it_reduce_scatters_every_micro_batch(tmp_path):
    run_on_gloo(WORLD, accumulate_both_ways, save_tiny_model(tmp_path / "model"), tmp_path / "out.pt")
    results = torch.load(tmp_path / "out.pt", weights_only=False)
    for name, grad in results[-1]["gradients"].items():
        assert torch.equal(grad, results[2]["gradients"][name]), name
    plain, hsdp = results[-1]["reduced"], results[2]["reduced"]
    assert results[2]["outer"] == hsdp  # the outer counter sees FSDP2's all-reduce through the inner wrapper
    assert hsdp["reduce_scatter"] == 2 * plain["reduce_scatter"]  # every micro-batch, over half as many ranks...
    assert hsdp["fsdp_all_reduce"] == plain["reduce_scatter"] // 2  # ...and one all-reduce of the half-size shards


def hsdp_checkpoint_into_plain_fsdp2(rank, world, model_dir, checkpoint_dir, out_path):
    """Train one step under HSDP, save; load into a plain FSDP2 model and optimizer (and back into HSDP)."""
    ids = torch.randint(4, 60, (2, 12), generator=torch.Generator().manual_seed(rank))
    models = {}
    for fsdp_size in (2, -1, 2):
        model = build_model(ModelConfig(path=str(model_dir), dtype="float32"), "actor")
        shard_model(model, init_device_mesh("cpu", (world,)), ShardingOptions(shard_group_size=fsdp_size))
        optimizer = build_optimizer(model, OptimConfig(lr=1e-2))
        if not models:
            (model(input_ids=ids, labels=ids, use_cache=False).loss * world).backward()
            optimizer.step()
            save_sharded(checkpoint_dir, model, optimizer)
        else:
            load_sharded(checkpoint_dir, model, optimizer)
        moments = {name: full_tensor(optimizer.state[param]["exp_avg"]).clone()
                   for name, param in model.named_parameters()}
        params = {name: full_tensor(param.detach()).clone() for name, param in model.named_parameters()}
        models[len(models)] = dict(params=params, moments=moments)
    if rank == 0:
        torch.save(models, out_path)


def test_an_hsdp_checkpoint_loads_into_plain_fsdp2_and_back(tmp_path):
    run_on_gloo(WORLD, hsdp_checkpoint_into_plain_fsdp2, save_tiny_model(tmp_path / "model"), tmp_path / "ckpt",
                tmp_path / "out.pt")
    saved, plain, hsdp_again = torch.load(tmp_path / "out.pt", weights_only=False).values()
    for loaded in (plain, hsdp_again):
        for name, param in saved["params"].items():
            assert torch.equal(param, loaded["params"][name]), name
            assert torch.equal(saved["moments"][name], loaded["moments"][name]), name


def test_sharding_mesh_refuses_a_group_size_that_does_not_divide_the_ranks(tmp_path):
    run_on_gloo(2, _refuse_three)


def _refuse_three(rank, world):
    mesh = init_device_mesh("cpu", (world,))
    assert sharding_mesh(mesh, -1) is mesh and sharding_mesh(mesh, world) is mesh
    with pytest.raises(ValueError, match="fsdp_size=3 must be -1 or a divisor of the 2 data-parallel ranks"):
        sharding_mesh(mesh, 3)


def hsdp_in_two_process_groups(rank, world, second_port):
    """The HSDP mesh of the group a process is in now, after it left one where it had made the same mesh: a reused
    worker process (the pooled gloo ranks here, a parked Ray worker) does this."""
    import os

    import torch.distributed as dist

    for attempt in range(2):
        if attempt:
            dist.destroy_process_group()
            os.environ["MASTER_PORT"] = str(second_port)
            dist.init_process_group("gloo", rank=rank, world_size=world)
        layer = torch.nn.Linear(4, 4)
        fully_shard(layer, mesh=sharding_mesh(init_device_mesh("cpu", (world,)), 1))
        layer(torch.ones(2, 4)).sum().backward()
        assert full_tensor(layer.weight.grad).shape == (4, 4), attempt  # its collectives find their groups


def test_the_hsdp_mesh_belongs_to_the_process_group_of_the_moment():
    from gloo_spawn import free_port

    run_on_gloo(2, hsdp_in_two_process_groups, free_port())


def meshes_of_two_groups_in_one_process(rank, world, second_port):
    """First a mesh over a group of its own (named "1": made after the default group), then, after leaving, an equal
    mesh over the new default group (named "0"): torch's DTensor caches take the two meshes for one."""
    import os

    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

    from hybridrl.utils.distributed import leave_process_group

    for attempt in range(2):
        if attempt:
            leave_process_group()
            os.environ["MASTER_PORT"] = str(second_port)
            dist.init_process_group("gloo", rank=rank, world_size=world)
        mesh = DeviceMesh.from_group(dist.new_group([0, 1]), "cpu") if attempt == 0 else init_device_mesh(
            "cpu", (world,))
        layer = torch.nn.Linear(4, 4)
        fully_shard(layer, mesh=mesh)
        doubled = layer.weight.detach() * 2  # a tensor made by DTensor's dispatch: its spec may come from a cache
        assert layer.weight.device_mesh._dim_group_names == mesh._dim_group_names, attempt
        assert doubled.device_mesh._dim_group_names == mesh._dim_group_names, attempt
        assert full_tensor(doubled).shape == (4, 4), attempt


def test_a_process_that_left_its_group_forgets_the_meshes_cached_for_it():
    """Without ``leave_process_group`` clearing them, the second mesh's tensors carried the first one's group "1"
    (gone: "Could not resolve the process group registered under the name 1", seen in a pooled gloo rank)."""
    from gloo_spawn import free_port

    run_on_gloo(2, meshes_of_two_groups_in_one_process, free_port(), fresh=True)
