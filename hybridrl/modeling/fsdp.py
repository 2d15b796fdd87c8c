"""FSDP2 wrapping: ``fully_shard`` on every decoder layer, then on the root, with mixed precision and offload (a
single rank that keeps its parameters gathered: no FSDP2 at all, :mod:`hybridrl.modeling.single_rank`)."""

from __future__ import annotations

import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Optional

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import (CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, fully_shard,
                                    register_fsdp_forward_method)

from hybridrl.modeling.model_builder import decoder_layers
from hybridrl.modeling.single_rank import apply_compute_dtype, casts_kept

# FSDP2 warns once per process that the root returned a view (transformers' outputs are): an in-place op on it would
# skip the pre-backward hook. hybridrl never writes into a model's outputs (its in-place ops act on tensors it made,
# inside its own autograd functions), so the line says nothing a user can act on; every other warning stays.
warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor", category=UserWarning)
from hybridrl.utils.distributed import sharding_mesh


@dataclass(frozen=True)
class ShardingOptions:
    """How one model is sharded. ``compute_dtype`` is the dtype of forward/backward; master weights stay fp32.

    ``reduce_dtype`` is the dtype of the gradient reduce-scatter (fp32 keeps accumulation exact).
    ``shard_group_size`` (``*.fsdp.fsdp_size``): shard within groups of that many ranks and replicate across them
    (HSDP); -1 shards over all ranks.
    ``keep_gathered``: the parameters stay gathered through each step or pass (``*.fsdp.gather_once``). On a one-rank
    mesh (:func:`without_fsdp`: no ``param_offload``, fp32 ``reduce_dtype``) the model is then not FSDP2-wrapped:
    per-layer groups only let layers be gathered, freed and reduced one at a time, which a kept-gathered single rank
    never does, and FSDP2 costs hooks on every forward (every decode step of HF generation too), a gradient copy and
    a reduce call per micro-batch.
    :func:`~hybridrl.modeling.single_rank.apply_compute_dtype` gives the same numerics (fp32 master weights, compute
    dtype in forward and backward, fp32 gradient accumulation) with one cast of the weights per step.
    """

    compute_dtype: torch.dtype = torch.float32
    reduce_dtype: torch.dtype = torch.float32
    reshard_after_forward: bool = True
    param_offload: bool = False
    keep_gathered: bool = False
    shard_group_size: int = -1


def without_fsdp(world_size: int, options: ShardingOptions) -> bool:
    """Whether a model is left unwrapped (:mod:`~hybridrl.modeling.single_rank` mixed precision) rather than FSDP2:
    one rank keeping its parameters gathered, no parameter offload (FSDP2's), fp32 gradient accumulation (the
    single-rank path always accumulates in fp32; a bf16 ``reduce_dtype`` keeps FSDP2's bf16 accumulation)."""
    return (options.keep_gathered and world_size == 1 and not options.param_offload
            and options.reduce_dtype == torch.float32)


def shard_model(model: nn.Module, mesh: Optional[DeviceMesh], options: ShardingOptions) -> nn.Module:
    """Apply FSDP2 in place and return ``model`` (now an ``FSDPModule``). ``mesh=None`` leaves it unsharded.

    FSDP2 *averages* gradients over ranks. The losses here are already normalised by the global token or sequence
    count of the mini-batch, so the accumulation loop multiplies each rank's loss by the DP size to cancel the
    average (a divide factor of 1 would need PREMUL_SUM, which gloo lacks). With HSDP (``shard_group_size``) FSDP2
    averages within a shard group (reduce-scatter) and then across the groups (all-reduce): over all ranks again.
    """
    if mesh is None:
        return model
    if without_fsdp(mesh.size(), options):
        return apply_compute_dtype(model, options.compute_dtype)
    mesh = sharding_mesh(mesh, options.shard_group_size)
    # Inside the model activations stay in the compute dtype (a layer emitting fp32 would meet bf16 weights in the
    # next root-level op, e.g. a tied lm_head); only the root's outputs (logits, values) come back in fp32.
    layer_policy = MixedPrecisionPolicy(param_dtype=options.compute_dtype, reduce_dtype=options.reduce_dtype)
    root_policy = MixedPrecisionPolicy(param_dtype=options.compute_dtype, reduce_dtype=options.reduce_dtype,
                                       output_dtype=torch.float32)
    kwargs: dict = dict(mesh=mesh, reshard_after_forward=options.reshard_after_forward)
    if options.param_offload:
        # pin_memory needs an accelerator; on CPU-only machines it must be off.
        kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=torch.cuda.is_available())
    if not (options.keep_gathered and mesh.size() == 1):  # param_offload or a low reduce dtype: the root alone
        for layer in decoder_layers(model):
            fully_shard(layer, mp_policy=layer_policy, **kwargs)
    fully_shard(model, mp_policy=root_policy, **kwargs)
    if hasattr(model, "get_base_model"):  # PEFT's generate() calls the HF model below the FSDP root: gather there too
        register_fsdp_forward_method(model, "generate")
    return model


def syncs_gradients(grad_sync: str, index: int, num_micro_batches: int) -> bool:
    """Whether micro-batch ``index`` of ``num_micro_batches`` reduce-scatters gradients under ``grad_sync``.

    ``step``: only the last one — one reduce-scatter per optimizer step, but FSDP2 holds the whole model's unsharded
    gradients (in the reduce dtype) between micro-batches. ``micro_batch``: every one — K reduce-scatters per step,
    each rank accumulating into its gradient shard only. Both give the same update.
    """
    return grad_sync == "micro_batch" or index == num_micro_batches - 1


def set_gradient_sync(model: nn.Module, enabled: bool, all_reduce: Optional[bool] = None) -> None:
    """Turn cross-rank gradient reduction on (last micro-batch) or off (the others) for an FSDP2 model.

    ``all_reduce`` (HSDP only; default: as ``enabled``): whether this micro-batch's reduce-scatter is followed by the
    all-reduce across shard groups. With ``grad_sync=micro_batch`` only the last one's is: FSDP2 keeps the reduced
    shards of the others (one shard-sized buffer) and adds them in before that one all-reduce, so the groups —
    typically the nodes — exchange gradients once per optimizer step, not once per micro-batch. The same sum, in
    another order (tests/distributed/test_hsdp.py).
    """
    if hasattr(model, "set_requires_gradient_sync"):
        model.set_requires_gradient_sync(enabled)
        model.set_requires_all_reduce(enabled if all_reduce is None else all_reduce)


def _param_groups(module: FSDPModule) -> list:
    """The module's FSDP2 parameter groups (private state: one group in older torch, a list in newer)."""
    state = module._get_fsdp_state()
    groups = getattr(state, "_fsdp_param_groups", None)
    if groups is None:
        group = getattr(state, "_fsdp_param_group", None)
        groups = [] if group is None else [group]
    return list(groups)


def _reshards_after_forward(module: FSDPModule) -> bool:
    """The module's current ``reshard_after_forward`` (FSDP2 keeps it only in private state; where that state is not
    found, the default ``True`` is assumed)."""
    return all(getattr(group, "post_forward_mesh_info", True) is not None for group in _param_groups(module))


def _reshards_after_backward(module: FSDPModule) -> bool:
    return all(getattr(group, "reshard_after_backward", True) for group in _param_groups(module))


@contextmanager
def parameters_kept_gathered(model: nn.Module, *, through_backward: bool = False) -> Iterator[None]:
    """Inside, each FSDP2 group of ``model`` all-gathers its parameters once (at its first forward) and keeps them;
    on exit they are freed and every group's ``reshard_after_forward`` (and ``reshard_after_backward``) is what it
    was. A model that is not FSDP2-sharded passes through unchanged.

    For autoregressive generation on the training module: ``T`` decode steps cost one all-gather per group instead
    of ``T``. For the micro-batches of one optimizer step (``through_backward=True``, ``*.fsdp.gather_once``): one
    all-gather per group instead of two per micro-batch (forward, and again in backward). Either way the price is
    one unsharded copy of the parameters in the compute dtype while inside. Leave before the optimizer step: it
    updates the shards, and gathered copies would be stale. A single-rank model without FSDP2
    (:mod:`~hybridrl.modeling.single_rank`) keeps its compute-dtype casts instead.
    """
    modules = [module for module in model.modules() if isinstance(module, FSDPModule)]
    if not modules:
        with casts_kept(model):
            yield
        return
    saved = [(_reshards_after_forward(module), _reshards_after_backward(module)) for module in modules]
    for module in modules:
        module.set_reshard_after_forward(False, recurse=False)
        if through_backward:
            module.set_reshard_after_backward(False, recurse=False)
    try:
        yield
    finally:
        for module, (after_forward, after_backward) in zip(modules, saved):
            module.reshard()
            module.set_reshard_after_forward(after_forward, recurse=False)
            module.set_reshard_after_backward(after_backward, recurse=False)
