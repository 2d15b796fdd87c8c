"""How an RL run is laid out (``replicas/placement.py``): pools per role, and on CPU how many threads each worker gets
when the trainer and a standalone rollout pool compute at the same time."""

from __future__ import annotations

import pytest

from hybridrl.config import load_config
from hybridrl.runtime.resource_pool import PoolSpec
from hybridrl.replicas import concurrent_node_slots, role_pools, rollout_replica_roles
from hybridrl.utils.distributed import cpu_share_per_worker

SPLIT = ["trainer.device=cpu", "rollout=vllm_cpu", "trainer.n_gpus_per_node=1", "rollout.n_gpus=2"]


@pytest.mark.parametrize("overrides, slots", [
    (SPLIT, None),  # sync: the pools take turns, each may use every core while it computes
    ([*SPLIT, "async_training.mode=bounded", "async_training.max_staleness=0"], None),  # η = 0 takes turns too
    ([*SPLIT, "async_training.mode=one_step_off"], 3),  # 1 trainer slot + 2 replica slots at once
    ([*SPLIT, "async_training.mode=bounded", "async_training.max_staleness=2"], 3),
])
def test_cpu_threads_are_split_only_where_the_pools_overlap(overrides, slots):
    config = load_config(overrides, check_paths=False)
    assert concurrent_node_slots(config) == slots
    pools = role_pools(config)
    specs = pools.specs
    assert set(specs) == {"global", *rollout_replica_roles(config)} == {"global", "rollout0", "rollout1"}
    for spec in specs.values():
        assert spec.node_slots == slots
        share = cpu_share_per_worker(spec.device, spec.node_slots or spec.devices_per_node, 1.0)
        assert share == (1.0 if slots is None else 1 / 3)


def test_a_pool_cannot_claim_fewer_node_slots_than_its_own_devices():
    with pytest.raises(ValueError, match="node_slots=1 must count at least its own 2 device"):
        PoolSpec("global", devices_per_node=2, device="cpu", node_slots=1)
