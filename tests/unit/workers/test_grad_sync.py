"""``fsdp.grad_sync`` from the config to the accumulation loop: which micro-batches reduce-scatter, and the workers'
micro-batching carrying the role's mode (the exactness and memory of each mode are tested under real FSDP2 in
``tests/distributed/test_grad_accum_invariance.py`` and ``test_grad_sync_memory.py``)."""

from __future__ import annotations

import pytest

from hybridrl.config import load_config
from hybridrl.engines.micro_batches import MicroBatching
from hybridrl.workers.building import log_prob_micro_batching, training_micro_batching
from hybridrl.modeling.fsdp import syncs_gradients


def test_which_micro_batches_reduce_scatter():
    assert [syncs_gradients("step", index, 4) for index in range(4)] == [False, False, False, True]
    assert [syncs_gradients("micro_batch", index, 4) for index in range(4)] == [True] * 4
    assert syncs_gradients("step", 0, 1) and syncs_gradients("micro_batch", 0, 1)


def test_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="grad_sync"):
        MicroBatching(micro_batch_size=2, grad_sync="layer")


def test_workers_micro_batching_carries_each_roles_mode():
    config = load_config(["algorithm=gae", "critic.fsdp.grad_sync=micro_batch", "actor.use_dynamic_bsz=true",
                          "actor.ppo_max_token_len_per_gpu=64", "actor.fsdp.grad_sync=micro_batch"], check_paths=False)
    assert training_micro_batching(config.actor, None, "cuda", 2) == MicroBatching(max_tokens=64,
                                                                                   grad_sync="micro_batch")
    assert training_micro_batching(config.critic, 2, "cuda", 2) == MicroBatching(micro_batch_size=2,
                                                                                  grad_sync="micro_batch")
    default = load_config(["algorithm=gae"], check_paths=False)
    assert training_micro_batching(default.critic, 2, "cuda", 2).grad_sync == "step"


@pytest.mark.parametrize("setting, device_type, world_size, expected", [
    ("auto", "cpu", 2, True), ("auto", "cuda", 2, False), ("auto", "cuda", 1, True), (True, "cuda", 2, True),
    (False, "cpu", 1, False), (False, "cuda", 1, False)])
def test_gather_once_resolves_auto_by_device_and_world_size(setting, device_type, world_size, expected):
    config = load_config([f"actor.fsdp.gather_once={str(setting).lower()}"], check_paths=False)
    assert training_micro_batching(config.actor, 2, device_type, world_size).gather_once is expected
    assert log_prob_micro_batching(config, None, 2, device_type, world_size).gather_once is expected


def test_auto_micro_batch_sizing_drops_the_unsharded_gradients_with_micro_batch_sync():
    from hybridrl.planner.known_models import KNOWN_SHAPES
    from hybridrl.autotune.auto_micro_batch import sizing_options
    from hybridrl.autotune.memory_sizing import estimate_micro_batch_bytes

    shape = KNOWN_SHAPES["qwen2.5-0.5b"]
    estimates = {}
    for grad_sync in ("step", "micro_batch"):
        config = load_config([f"actor.fsdp.grad_sync={grad_sync}"], check_paths=False)
        options = sizing_options(config, "actor", world_size=4)
        assert options["accumulating"] == (grad_sync == "step")
        estimates[grad_sync] = estimate_micro_batch_bytes(shape, 2, 256, **options)
    saved = estimates["step"].total - estimates["micro_batch"].total
    in_flight = 4 * (shape.root_parameters() + shape.layer_parameters())
    assert saved == 4 * shape.num_parameters() - 4 * -(-shape.num_parameters() // 4) - in_flight
