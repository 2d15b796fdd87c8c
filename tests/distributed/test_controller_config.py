"""Controller settings without starting Ray: ``RayConfig`` validation, ``ray.init`` arguments, the worker
environment, pool specs and the role → pool mapping."""

from __future__ import annotations

import os

import pytest

from hybridrl.config.ray import RayConfig
from hybridrl.runtime import PoolSpec, ResourcePool, ResourcePoolManager, start_ray
from hybridrl.runtime.ray_runtime import RAY_ENV_DEFAULTS, ray_init_kwargs
from hybridrl.utils.distributed import KERNEL_CACHE_VARIABLES, dp_tp_coordinates, package_root, worker_process_env


@pytest.mark.parametrize("overrides,key", [
    ({"address": ""}, "trainer.ray.address"),
    ({"num_cpus": 0}, "trainer.ray.num_cpus"),
    ({"address": "auto", "num_cpus": 4}, "trainer.ray.num_cpus"),
    ({"address": "10.0.0.1:6379", "num_gpus": 8}, "trainer.ray.num_gpus"),
    ({"object_store_memory_mb": 10}, "trainer.ray.object_store_memory_mb"),
    ({"logging_level": "loud"}, "trainer.ray.logging_level"),
    ({"call_timeout_s": 0}, "trainer.ray.call_timeout_s"),
    ({"placement_timeout_s": -1}, "trainer.ray.placement_timeout_s"),
    ({"failure_grace_s": -1}, "trainer.ray.failure_grace_s"),
    ({"cpu_kernel_cache_capacity": 0}, "trainer.ray.cpu_kernel_cache_capacity"),
    ({"worker_env": {"A": 1}}, "trainer.ray.worker_env"),
])
def test_invalid_ray_config_names_the_key(overrides, key):
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        RayConfig(**overrides).validate()


def test_default_config_is_valid_and_local():
    config = RayConfig()
    config.validate()
    assert ray_init_kwargs(config) == {
        "address": "local", "logging_level": "WARNING", "log_to_driver": True, "num_cpus": None, "num_gpus": None,
        "object_store_memory": 200 * 2**20, "include_dashboard": False,
        "_system_config": {"enable_worker_prestart": False, "prestart_worker_first_driver": False},
    }
    # attaching passes no resource settings (Ray refuses them for an existing cluster)
    assert ray_init_kwargs(RayConfig(address="auto")) == {"address": "auto", "logging_level": "WARNING",
                                                          "log_to_driver": True}


def test_ray_environment_defaults_are_set_on_import():
    for key in RAY_ENV_DEFAULTS:
        assert key in os.environ


def test_worker_environment(monkeypatch):
    for key in KERNEL_CACHE_VARIABLES:
        monkeypatch.delenv(key, raising=False)
    cpu = worker_process_env("cpu", {"PYTHONPATH": "/extra", "NCCL_DEBUG": "INFO", "MY_FLAG": "1"})
    assert cpu["OMP_NUM_THREADS"] == "1" and cpu["MKL_NUM_THREADS"] == "1"
    assert cpu["PYTHONPATH"] == os.pathsep.join(["/extra", package_root()])
    assert cpu["NCCL_DEBUG"] == "INFO" and cpu["MY_FLAG"] == "1"
    assert not set(KERNEL_CACHE_VARIABLES) & set(cpu)  # trainer.ray.cpu_kernel_cache_capacity=null
    bounded = worker_process_env("cpu", {"LRU_CACHE_CAPACITY": "512"}, kernel_cache_capacity=128)
    assert bounded["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "128" and bounded["LRU_CACHE_CAPACITY"] == "512"
    monkeypatch.setenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "256")  # the user's own export is kept
    assert "ONEDNN_PRIMITIVE_CACHE_CAPACITY" not in worker_process_env("cpu", kernel_cache_capacity=128)
    cuda = worker_process_env("cuda", kernel_cache_capacity=128)
    assert not set(KERNEL_CACHE_VARIABLES) & set(cuda)
    assert "OMP_NUM_THREADS" not in cuda and cuda["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
    assert os.path.isdir(os.path.join(package_root(), "hybridrl"))
    with pytest.raises(ValueError, match="device"):
        worker_process_env("tpu")


def test_rollout_layout_is_row_major():
    assert [dp_tp_coordinates(rank, 2) for rank in range(4)] == [(0, 0), (0, 1), (1, 0), (1, 1)]


def test_pool_specs():
    spec = PoolSpec("global", nnodes=2, devices_per_node=4, device="cuda", cpus_per_device=2)
    assert spec.world_size == 8 and spec.bundle == {"GPU": 1.0, "CPU": 2}
    assert PoolSpec("cpu", devices_per_node=2, device="cpu").bundle == {"CPU": 1.0}
    with pytest.raises(ValueError, match="nnodes=0"):
        PoolSpec("bad", nnodes=0)
    with pytest.raises(ValueError, match="device"):
        PoolSpec("bad", device="gpu")


def test_role_to_pool_mapping_in_local_mode():
    runtime = start_ray(RayConfig(local_mode=True))
    manager = ResourcePoolManager(
        [PoolSpec("global", devices_per_node=2, device="cpu"), PoolSpec("critic", devices_per_node=1, device="cpu")],
        {"actor": "global", "rollout": "global", "ref": "global", "critic": "critic"})
    assert manager.roles_in("global") == ["actor", "rollout", "ref"]
    with pytest.raises(RuntimeError, match="not created yet"):
        manager.pool_for("actor")
    manager.create(runtime)
    assert manager.pool_for("rollout") is manager.pool_for("actor")
    assert isinstance(manager.pool_for("critic"), ResourcePool) and manager.pool_for("critic").world_size == 1
    assert manager.pool_for("critic").local_mode and manager.pool_for("critic").placement_groups == []
    with pytest.raises(KeyError, match="reward_model"):
        manager.pool_for("reward_model")
    manager.release()
    with pytest.raises(ValueError, match="not one of"):
        ResourcePoolManager([PoolSpec("global")], {"critic": "elsewhere"})
    with pytest.raises(ValueError, match="unique"):
        ResourcePoolManager([PoolSpec("a"), PoolSpec("a")], {})
