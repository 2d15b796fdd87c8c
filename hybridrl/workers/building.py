"""What every trained role builds the same way on its rank: its data-parallel group (and the sequence-parallel group
that splits its rows' positions), sharding options and micro-batching (from the role's config section and its
resolved batch plan)."""

from __future__ import annotations

from typing import Optional

from hybridrl.config.schema import TrainConfig
from hybridrl.config.sizes import gathers_once
from hybridrl.engines.base import TrainingEngine
from hybridrl.engines.micro_batches import DataParallelGroup, MicroBatching
from hybridrl.modeling.fsdp import ShardingOptions, shard_model
from hybridrl.modeling.model_builder import build_model, torch_dtype
from hybridrl.modeling.ulysses import SequenceParallelLayout, install_ulysses, sequence_parallel_layout
from hybridrl.runtime import Worker


def data_parallel_group(worker: Worker, sp_size: int = 1) -> DataParallelGroup:
    """The worker's data-parallel group: the ranks that hold different rows — all ranks of the group (FSDP shards
    over them), or with ``sp_size`` > 1 one rank of each sequence-parallel group (``[DP, SP]`` row-major, as the
    group's ``dp_split`` calls hand out rows)."""
    if sp_size == 1:
        mesh = worker.dp_mesh
        return DataParallelGroup(group=mesh.get_group() if mesh is not None else None, rank=worker.rank,
                                 size=worker.world_size)
    layout = _sequence_parallel_layout(worker, sp_size)
    return DataParallelGroup(group=layout.dp_group, rank=layout.dp_rank, size=layout.dp_size)


def split_sequences(worker: Worker, model, sp_size: int) -> None:
    """With ``sp_size`` > 1, make ``model``'s training and log-prob forwards split every sequence over the worker's
    sequence-parallel group (:mod:`hybridrl.modeling.ulysses`; generation with a KV cache is not split)."""
    if sp_size > 1 and model is not None:
        install_ulysses(model, _sequence_parallel_layout(worker, sp_size).sp)


def _sequence_parallel_layout(worker: Worker, sp_size: int) -> SequenceParallelLayout:
    """The worker's ``[DP, SP]`` groups, made once (every rank makes every group, in the same order)."""
    layout = getattr(worker, "_hybridrl_sp_layout", None)
    if layout is None:
        layout = sequence_parallel_layout(sp_size)
        worker._hybridrl_sp_layout = layout
    elif layout.sp.size != sp_size:
        raise ValueError(f"this worker's ranks already split sequences {layout.sp.size} ways, not {sp_size}")
    return layout


def frozen_engine(worker: Worker, model_config, path: Optional[str], sharding: ShardingOptions,
                  dp: DataParallelGroup) -> Optional[TrainingEngine]:
    """A frozen causal LM of ``path`` (a reference policy, a distillation teacher) on ``worker``'s device, sharded
    over its ranks with ``sharding``, for no-grad passes; ``None`` without a path."""
    if not path:
        return None
    model = build_model(model_config, "reference", path=path, device_type=worker.device.type).to(worker.device)
    model.requires_grad_(False)
    shard_model(model, worker.dp_mesh, sharding)
    return TrainingEngine(model, dp=dp)


def sharding_options(model_dtype: str, fsdp, *, keep_gathered: bool,
                     param_offload: Optional[bool] = None, fsdp_size: Optional[int] = None) -> ShardingOptions:
    """FSDP2 options of a role: compute dtype ``model.dtype``; ``reduce_dtype``, ``reshard_after_forward``, and
    (unless given) ``param_offload`` and ``fsdp_size`` from its ``fsdp`` section; ``keep_gathered``: ``gather_once``
    as resolved."""
    return ShardingOptions(compute_dtype=torch_dtype(model_dtype), reduce_dtype=torch_dtype(fsdp.reduce_dtype),
                           reshard_after_forward=fsdp.reshard_after_forward,
                           param_offload=fsdp.param_offload if param_offload is None else param_offload,
                           keep_gathered=keep_gathered,
                           shard_group_size=fsdp.fsdp_size if fsdp_size is None else fsdp_size)


def log_prob_micro_batching(config: TrainConfig, micro_batch_size: int | None, ppo_micro_batch_size: int | None,
                            device_type: str, world_size: int) -> MicroBatching:
    """Micro-batches of no-grad forwards: the role's log-prob size, else the PPO micro-batch (as resolved, when
    ``auto``: a forward without gradients needs less than the forward/backward it was sized for), or the token
    budget; parameters gathered once per pass as ``actor.fsdp.gather_once`` says."""
    gather_once = gathers_once(config.actor.fsdp.gather_once, device_type, world_size)
    if config.actor.use_dynamic_bsz:
        return MicroBatching(max_tokens=token_budget(config.actor), gather_once=gather_once)
    return MicroBatching(micro_batch_size=micro_batch_size or ppo_micro_batch_size, gather_once=gather_once)


def training_micro_batching(role_config, micro_batch_size: int | None, device_type: str,
                            world_size: int) -> MicroBatching:
    """Micro-batches of a role's update (``ActorConfig`` / ``CriticConfig``): its token budget with
    ``use_dynamic_bsz``, else ``micro_batch_size`` sequences; gradients synced as its ``fsdp.grad_sync`` says,
    parameters gathered once per step as its ``fsdp.gather_once`` says."""
    options = dict(grad_sync=role_config.fsdp.grad_sync, defer_all_reduce=role_config.fsdp.defer_all_reduce,
                   gather_once=gathers_once(role_config.fsdp.gather_once, device_type, world_size))
    if role_config.use_dynamic_bsz:
        return MicroBatching(max_tokens=token_budget(role_config), **options)
    return MicroBatching(micro_batch_size=micro_batch_size, **options)


def token_budget(role_config) -> int:
    """Tokens of one micro-batch (``use_dynamic_bsz``): ``ppo_max_token_len_per_gpu`` per device, so ``SP ×`` that
    for the whole sequences a sequence-parallel group of ``SP`` ranks shares."""
    return role_config.ppo_max_token_len_per_gpu * role_config.ulysses_sequence_parallel_size
