"""Measuring memory: bytes autograd saves, the peak of live tensors (CPU), the CUDA allocator's peak (GPU).

The analytic model these check lives in :mod:`hybridrl.autotune.memory_sizing`; ``make_probe`` turns
:func:`probe_peak_bytes` into the ``MeasureFn`` that :func:`~hybridrl.autotune.memory_sizing.choose_micro_batch_size`
takes.
"""

from __future__ import annotations

import contextlib
import math
from typing import Callable, Optional

import torch
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from hybridrl.modeling.fsdp import parameters_kept_gathered, set_gradient_sync, syncs_gradients
from hybridrl.engines.precision import plain_tensors
from hybridrl.modeling.sequences import response_log_probs

MeasureFn = Callable[[int, int], float]

# ------------------------------------------------------------------------------------------------------ measurement
class SavedTensorBytes(torch.autograd.graph.saved_tensors_hooks):
    """Bytes of the distinct storages autograd saves for backward inside the ``with`` block (parameters excluded;
    a tensor saved by several ops, like the input shared by q/k/v, counts once, as it occupies memory once)."""

    def __init__(self, model: Optional[nn.Module] = None) -> None:
        self.bytes = 0
        self._seen: set[int] = set()
        if model is not None:
            self._seen.update(p.untyped_storage().data_ptr() for p in model.parameters())
        super().__init__(self._pack, lambda tensor: tensor)

    def __enter__(self) -> "SavedTensorBytes":
        super().__enter__()
        return self

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in self._seen:
            self._seen.add(storage.data_ptr())
            self.bytes += storage.nbytes()
        return tensor


class LiveTensorPeak(TorchDispatchMode):
    """The peak of live bytes of tensor storages created inside the ``with`` block, forward and backward.

    Every aten op's outputs are inspected; a storage not among the op's inputs is a new allocation and is tracked with
    a weak reference until it is freed. Storages that existed before the block (parameters, gradients accumulated in
    place) are not counted. Costs a Python call per op: for probes on small models, not for training.
    """

    def __init__(self) -> None:
        super().__init__()
        self._tracked: dict[int, tuple[StorageWeakRef, int]] = {}
        self.live_bytes = 0
        self.peak_bytes = 0

    def _release_freed(self) -> None:
        for key in [key for key, (ref, _) in self._tracked.items() if ref.expired()]:
            self.live_bytes -= self._tracked.pop(key)[1]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage()._cdata for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        self._release_freed()
        for tensor in tree_leaves(out):
            if not isinstance(tensor, torch.Tensor):
                continue
            storage = tensor.untyped_storage()
            if storage._cdata in inputs or storage._cdata in self._tracked:
                continue
            self._tracked[storage._cdata] = (StorageWeakRef(storage), storage.nbytes())
            self.live_bytes += storage.nbytes()
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        return out


def resident_bytes(model: nn.Module, optimizer: Optional[torch.optim.Optimizer] = None) -> int:
    """Bytes of the tensors that stay resident between steps: parameters, buffers, gradients, optimizer state."""
    storages: dict[int, int] = {}
    tensors = [*model.parameters(), *model.buffers()]
    tensors += [p.grad for p in model.parameters() if p.grad is not None]
    if optimizer is not None:
        tensors += [value for state in optimizer.state.values() for value in state.values()
                    if isinstance(value, torch.Tensor)]
    for tensor in tensors:
        for local in plain_tensors(tensor):
            storages[local.untyped_storage().data_ptr()] = local.untyped_storage().nbytes()
    return sum(storages.values())



def probe_peak_bytes(model: nn.Module, micro_batch_size: int, seq_len: int, *, packed: bool = False,
                     accumulating: bool = True, grad_sync: str = "step", gather_once: bool = False,
                     optimizer: Optional[torch.optim.Optimizer] = None, dp=None) -> float:
    """Peak bytes of a forward+backward of ``micro_batch_size`` random sequences of ``seq_len`` tokens on this rank.

    The batch is the worst case of a padded RL batch: every row full length except one pad token (so sdpa gets a mask,
    as with real padding), every token after a 2-token prompt scored with a token-mean NLL through the same
    ``response_log_probs`` path as the actor. With ``accumulating`` two micro-batches run as in training under
    ``grad_sync`` (:func:`~hybridrl.modeling.fsdp.syncs_gradients`): with ``step`` the first runs without gradient sync
    (FSDP2 then holds the whole model's unsharded gradients), the second with it; with ``micro_batch`` both sync, so
    only the sharded gradients accumulate. The peak includes the gradients already accumulated; without
    ``accumulating`` one synced micro-batch. ``gather_once``: the micro-batches run with the parameters kept gathered
    (cast once, on one rank), as the update then does. CUDA: ``max_memory_allocated`` (absolute,
    states included; an out-of-memory error returns ``math.inf``). CPU: :func:`resident_bytes` +
    :class:`LiveTensorPeak` over the whole probe.

    Gradients are left ``None`` afterwards, so probe before training, not between micro-batches. Under FSDP2 every
    rank must call it (forward and backward issue collectives); with ``dp`` the result is the maximum over ranks.
    A CUDA OOM on one rank in the middle of a sharded forward leaves the others waiting in a collective: probe
    ascending sizes (as :func:`choose_micro_batch_size` does) and pre-screen with the analytic model.
    """
    device = next(model.parameters()).device
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(0, model.config.vocab_size, (micro_batch_size, seq_len), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[0, 0] = 0
    input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
    num_micro_batches = 2 if accumulating else 1

    def forward_backward() -> None:
        kept = parameters_kept_gathered(model, through_backward=True) if gather_once else contextlib.nullcontext()
        with kept:
            for index in range(num_micro_batches):
                set_gradient_sync(model, syncs_gradients(grad_sync, index, num_micro_batches),
                                  all_reduce=index == num_micro_batches - 1)  # as the engine: HSDP's once
                log_probs, _ = response_log_probs(model, input_ids, attention_mask, seq_len - 2, packed=packed)
                (-log_probs.sum() / log_probs.numel()).backward()
                del log_probs

    model.zero_grad(set_to_none=True)
    if device.type == "cuda":
        peak = _cuda_peak(forward_backward, device)
    else:
        resident = resident_bytes(model, optimizer)
        with LiveTensorPeak() as tracker:
            forward_backward()
        peak = float(resident + tracker.peak_bytes)
    model.zero_grad(set_to_none=True)
    if dp is not None and dp.size > 1:
        peak = max_over_ranks(peak, dp, device)
    return peak


def _cuda_peak(forward_backward: Callable[[], None], device: torch.device) -> float:
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    try:
        forward_backward()
        torch.cuda.synchronize(device)
    except torch.OutOfMemoryError:
        torch.cuda.empty_cache()
        return math.inf
    return float(torch.cuda.max_memory_allocated(device))


def max_over_ranks(value: float, dp, device: torch.device) -> float:
    """The maximum of ``value`` over ``dp``'s ranks (one all-reduce on ``device``)."""
    import torch.distributed as dist

    tensor = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=dp.group)
    return float(tensor.item())


def make_probe(model: nn.Module, **options) -> MeasureFn:
    """A :data:`MeasureFn` that runs :func:`probe_peak_bytes` (same keyword options)."""
    return lambda micro_batch_size, seq_len: probe_peak_bytes(model, micro_batch_size, seq_len, **options)


