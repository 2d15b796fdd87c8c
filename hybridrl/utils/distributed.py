"""Process-level distributed set-up for worker processes — the one place that decides it.

- ``worker_process_env``: the environment every worker process starts with (threads, NCCL/gloo, import path).
- ``rank_env``: the per-rank ``torch.distributed`` variables (``RANK``, ``MASTER_ADDR``, …).
- ``init_process_group`` / ``build_device_meshes``: the process group (gloo on CPU, NCCL + gloo on CUDA) and the
  two meshes every worker gets: ``dp`` (all ranks; FSDP shards over it) and ``rollout`` (``[dp, tp]``, row-major, so
  ranks ``d*tp .. d*tp+tp-1`` form the tensor-parallel group of data-parallel replica ``d``).

Nothing here imports Ray; the controller calls these inside the worker processes.
"""

from __future__ import annotations

import os
import socket
import sys
from datetime import timedelta
from pathlib import Path
from typing import Mapping, Optional

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

DEVICES = ("cpu", "cuda")

KERNEL_CACHE_VARIABLES = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")
"""How many compiled kernels a CPU process keeps: oneDNN's primitive cache and the cache of torch's ideep layer above
it (1024 each by default). Each distinct matmul shape compiles its own, and their memory stays while cached: a
micro-batch's token count and a decode step's row count change the shape. Measured on the 2-core AMD EPYC (bf16,
SmolLM2-135M's widths, forward and backward of 5 linear shapes at 100 token counts from 200 to 700): +1006 MiB
resident with the defaults, +173 MiB at 64, at the same speed; a too small cache that drops a step's own kernels
recompiles them every call (capacity 4: 1.2–1.35× slower there). Both are read at a process's first oneDNN call."""


def package_root() -> str:
    """The directory holding the ``hybridrl`` package, so worker processes can import it without an install."""
    return str(Path(__file__).resolve().parents[2])


def worker_process_env(device: str, extra: Optional[Mapping[str, str]] = None,
                       kernel_cache_capacity: Optional[int] = None) -> dict[str, str]:
    """Environment variables every worker process of a ``device`` group starts with.

    CPU workers get one OpenMP/MKL thread each: several ranks share few cores, and oversubscription makes gloo
    collectives and matmuls crawl; and, when ``kernel_cache_capacity`` is set
    (``trainer.ray.cpu_kernel_cache_capacity``), oneDNN's two kernel caches bounded to that many entries
    (:data:`KERNEL_CACHE_VARIABLES`; one already in this process's environment is left to it). ``extra`` (``trainer.ray.worker_env``) overrides any default; a ``PYTHONPATH``
    in it is prepended to the entry that makes ``hybridrl`` importable.
    """
    check_device(device)
    env = {
        "TOKENIZERS_PARALLELISM": "false",
        # transformers' per-load progress bars, times ranks, bury the trainer's own progress display.
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
        "PYTHONUNBUFFERED": "1",
        # vLLM logs ~40 lines of engine set-up per rank at INFO/WARNING (missing triton, tcmalloc, ...); errors only.
        # trainer.ray.worker_env.VLLM_LOGGING_LEVEL=INFO brings them back for debugging.
        "VLLM_LOGGING_LEVEL": "ERROR",
        # NCCL: fail a stuck collective with an error instead of hanging forever; warnings only.
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        "NCCL_DEBUG": "WARN",
    }
    if device == "cpu":
        env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
        if kernel_cache_capacity is not None:  # a value exported where the controller runs is kept
            env.update({key: str(kernel_cache_capacity) for key in KERNEL_CACHE_VARIABLES if key not in os.environ})
    extra = dict(extra or {})
    paths = [p for p in (extra.pop("PYTHONPATH", ""), package_root()) if p]
    env.update(extra)
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def cpu_share_per_worker(device: str, devices_per_node: int, bundle_share: float) -> Optional[float]:
    """The share of its node's CPUs a worker may use for torch's threads: on CPU its device slot's part of the node
    (``1 / devices_per_node``) times its share of the slot (``bundle_share``: several groups colocated on one slot
    split it); ``None`` on CUDA (torch's default, unchanged). See :func:`threads_for_cpu_share`."""
    return bundle_share / devices_per_node if device == "cpu" else None


def threads_for_cpu_share(share: float) -> int:
    """``torch.set_num_threads`` value for a CPU worker with ``share`` of this node's usable CPUs: at least 1. Two
    ranks on a 2-core machine get one thread each (the OpenMP pools do not oversubscribe: ``OMP_NUM_THREADS=1`` in
    ``worker_process_env``); one rank gets both cores."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    return max(1, int(cpus * share + 1e-9))


def rank_env(rank: int, world_size: int, local_rank: int, local_world_size: int,
             master_addr: str, master_port: int) -> dict[str, str]:
    """The ``env://`` rendezvous variables of one rank (what ``torchrun`` would set)."""
    return {
        "RANK": str(rank), "WORLD_SIZE": str(world_size),
        "LOCAL_RANK": str(local_rank), "LOCAL_WORLD_SIZE": str(local_world_size),
        "MASTER_ADDR": master_addr, "MASTER_PORT": str(master_port),
    }


def node_address() -> str:
    """This process's node IP as Ray knows it (``127.0.0.1`` outside Ray): the address other nodes reach it at."""
    import ray

    return ray.util.get_node_ip_address() if ray.is_initialized() else "127.0.0.1"


def find_free_port() -> int:
    """A TCP port free on this host right now (the OS picks it; a tiny race with other processes remains)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


def check_device(device: str) -> None:
    if device not in DEVICES:
        raise ValueError(f"device must be one of {DEVICES}, got {device!r}")


def process_group_backend(device: str) -> str:
    """gloo on CPU; on CUDA NCCL for device tensors plus gloo for CPU tensors (object gathers, barriers)."""
    check_device(device)
    return "gloo" if device == "cpu" else "cpu:gloo,cuda:nccl"


def init_process_group(device: str, env: Mapping[str, str], timeout_s: float) -> None:
    """Export ``env`` (from ``rank_env``) into this process and join the default process group.

    ``timeout_s`` bounds the rendezvous and every later collective, so a peer that never arrives fails loudly.
    """
    os.environ.update(env)
    if device == "cuda":
        # Ray hands each worker its GPU(s) through CUDA_VISIBLE_DEVICES; the first visible one is this rank's.
        torch.cuda.set_device(0)
    dist.init_process_group(
        backend=process_group_backend(device), init_method="env://",
        rank=int(env["RANK"]), world_size=int(env["WORLD_SIZE"]), timeout=timedelta(seconds=timeout_s),
    )


def init_single_rank_group(device: str) -> bool:
    """Give this process a one-rank process group (the serial executor with world size 1).

    Returns ``True`` when this call created it (the caller then owns ``destroy_process_group``).
    """
    if dist.is_initialized():
        return False
    store = dist.HashStore()
    dist.init_process_group(backend=process_group_backend(device), store=store, rank=0, world_size=1)
    return True


def leave_process_group() -> None:
    """Destroy this process's default process group and forget what was cached for its meshes, so the process can
    join another group (a parked worker, a pooled test rank) as if it were new.

    torch's ``DTensor`` caches its sharding decisions (and its redistribution plans) by mesh *equality*, which looks
    at the ranks, shape, device and dimension names but not at the process groups behind the mesh. A process that
    left one group and meshes an equal layout in the next would get the old mesh back from those caches on its new
    tensors, and their collectives would name the old groups: gone (``Could not resolve the process group``), or,
    when a new group took the same name, the wrong one."""
    if dist.is_initialized():
        dist.destroy_process_group()
    forget_mesh_caches()


def forget_mesh_caches() -> None:
    """Clear the meshes and sharding decisions cached in this process (see :func:`leave_process_group`). A process
    that never imported DTensor has none, and is not made to import it (0.6-0.8 s of CPU: under load a worker's
    stop then outlasted its grace and its process was not parked)."""
    _SHARDING_MESHES.clear()
    if "torch.distributed.tensor" not in sys.modules:
        return
    from torch.distributed.tensor import DTensor, _redistribute

    DTensor._op_dispatcher.sharding_propagator.propagate_op_sharding.cache_clear()
    clear_native_cache = getattr(torch._C, "_clear_DTensor_sharding_propagator_cache", None)  # torch >= 2.9
    if clear_native_cache is not None:
        clear_native_cache()
    plans = getattr(_redistribute, "_gen_transform_infos", None)
    if plans is not None and hasattr(plans, "cache_clear"):
        plans.cache_clear()


def full_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The whole of a (possibly FSDP2-sharded) tensor: a ``DTensor`` gathered (a collective on every rank), a plain
    tensor as it is (one rank without FSDP2)."""
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def build_device_meshes(device: str, world_size: int, tp_size: int) -> tuple[DeviceMesh, DeviceMesh]:
    """``(dp_mesh, rollout_mesh)``: ``dp_mesh`` is 1-D ``("dp",)`` over all ranks (FSDP's); ``rollout_mesh`` is
    ``("dp", "tp")`` of shape ``[world_size // tp_size, tp_size]``. Must be called on every rank (it is collective)."""
    check_tp_size(world_size, tp_size)
    dp_mesh = init_device_mesh(device, (world_size,), mesh_dim_names=("dp",))
    rollout_mesh = init_device_mesh(device, (world_size // tp_size, tp_size), mesh_dim_names=("dp", "tp"))
    return dp_mesh, rollout_mesh


_SHARDING_MESHES: dict[tuple[str, int, int], tuple[object, DeviceMesh]] = {}
"""(device, world, size) → (the default process group the mesh's groups were made in, the mesh)."""


def sharding_mesh(dp_mesh: DeviceMesh, shard_group_size: int) -> DeviceMesh:
    """The mesh FSDP2 shards a model over: ``dp_mesh`` itself (``shard_group_size`` -1 or the world size: plain
    FSDP2), else the 2-D HSDP mesh ``("replicate", "shard")`` of shape ``[world // size, size]`` — each model is
    sharded within a group of ``size`` consecutive ranks and replicated across groups. Collective on first use
    (it creates the groups); cached per (device, world, size), so the actor and its reference share the groups —
    for the process group it was made in: a process that leaves its group and joins another (a reused worker
    process) gets a new mesh, never one whose groups are gone."""
    world = dp_mesh.size()
    if shard_group_size in (-1, world):
        return dp_mesh
    if shard_group_size < 1 or world % shard_group_size:
        raise ValueError(f"fsdp_size={shard_group_size} must be -1 or a divisor of the {world} data-parallel ranks")
    key, world_group = (dp_mesh.device_type, world, shard_group_size), dist.group.WORLD
    made_in, mesh = _SHARDING_MESHES.get(key, (None, None))
    if mesh is None or made_in is not world_group:
        mesh = init_device_mesh(dp_mesh.device_type, (world // shard_group_size, shard_group_size),
                                mesh_dim_names=("replicate", "shard"))
        _SHARDING_MESHES[key] = (world_group, mesh)
    return mesh


def check_tp_size(world_size: int, tp_size: int, name: str = "tp_size") -> None:
    if tp_size < 1 or world_size % tp_size:
        raise ValueError(f"{name}={tp_size} must be >= 1 and divide the group's world size {world_size}")


def dp_tp_coordinates(rank: int, tp_size: int) -> tuple[int, int]:
    """``(dp_rank, tp_rank)`` of ``rank`` in the row-major ``[dp, tp]`` rollout layout."""
    return rank // tp_size, rank % tp_size
