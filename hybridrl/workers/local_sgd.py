"""Communication-saving sync for a replicated (DDP-style) model: per-parameter-group sync intervals.

Every rank holds the whole model and trains on its own data. A parameter group with interval ``1`` is plain DDP:
its gradients are averaged over ranks before every optimizer step, so its weights never diverge. A group with
interval ``k > 1`` takes ``k`` purely local optimizer steps and then its **weights** are averaged (local SGD /
"post-local SGD" per group) — ``1/k`` of the group's communication, at the price of replicas drifting apart in
between. Optimizer states stay local (they are never averaged, so nothing extra moves).

``propose_intervals`` turns measured gradient change rates (``profile_gradient_change``) into intervals: a group
whose gradient changes slowly from step to step loses little by updating locally for a few steps; a group whose
gradient swings keeps syncing every step. ``benchmarks/local_sgd.py`` measures bytes and the loss curve honestly.

Use::

    sync = PeriodicSync(model, intervals={"embed": 10, "mlp": 5}, group_of=default_group_of, process_group=None)
    loss.backward(); sync.before_step(); optimizer.step(); sync.after_step()
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional, Sequence

import torch
import torch.distributed as dist
from torch import nn

_LAYER = re.compile(r"\.layers\.(\d+)\.")


def default_group_of(name: str) -> str:
    """A Hugging Face decoder parameter name → its group: ``embed`` (embeddings, LM head), ``norm`` (final norm),
    ``attn.<i>`` / ``mlp.<i>`` / ``norm.<i>`` for layer ``i``; anything else is its own name."""
    if "embed_tokens" in name or name.startswith("lm_head"):
        return "embed"
    layer = _LAYER.search(name)
    if layer is None:
        return "norm" if "norm" in name else name
    kind = "attn" if "self_attn" in name else "mlp" if ".mlp." in name else "norm"
    return f"{kind}.{layer.group(1)}"


@dataclass
class SyncStats:
    """Payload bytes this rank handed to all-reduce (a ring all-reduce puts ``2(N−1)/N`` of that on the wire)."""

    gradient_bytes: int = 0
    parameter_bytes: int = 0
    calls: int = 0
    per_group_bytes: dict[str, int] = field(default_factory=dict)

    @property
    def total_bytes(self) -> int:
        return self.gradient_bytes + self.parameter_bytes


class PeriodicSync:
    """Per-group sync intervals for a replicated model (see the module docstring).

    Args:
        model: the same module (same initial weights) on every rank.
        intervals: ``{group: k}``; groups not listed use ``default_interval``.
        group_of: parameter name → group (``default_group_of``).
        process_group: the data-parallel group (default world).
    """

    def __init__(self, model: nn.Module, intervals: Mapping[str, int], *, default_interval: int = 1,
                 group_of: Callable[[str], str] = default_group_of,
                 process_group: Optional[dist.ProcessGroup] = None) -> None:
        for group, interval in {**intervals, "<default>": default_interval}.items():
            if int(interval) < 1:
                raise ValueError(f"sync interval of group {group!r} must be >= 1, got {interval}")
        self.process_group = process_group
        self.world_size = dist.get_world_size(process_group) if dist.is_initialized() else 1
        self.groups: dict[str, list[nn.Parameter]] = {}
        self.names: dict[str, list[str]] = {}
        for name, param in model.named_parameters():
            if param.requires_grad:
                self.groups.setdefault(group_of(name), []).append(param)
                self.names.setdefault(group_of(name), []).append(name)
        unknown = set(intervals) - set(self.groups)
        if unknown:
            raise ValueError(f"sync intervals name groups the model does not have: {sorted(unknown)}; "
                             f"groups are {sorted(self.groups)}")
        self.intervals = {group: int(intervals.get(group, default_interval)) for group in self.groups}
        self.step = 0
        self.stats = SyncStats()

    def _average(self, tensors: Sequence[torch.Tensor], group: str, kind: str) -> None:
        """Average ``tensors`` over ranks in one flat all-reduce (a no-op on one rank)."""
        if self.world_size == 1 or not tensors:
            return
        flat = torch.cat([tensor.reshape(-1) for tensor in tensors])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=self.process_group)
        flat /= self.world_size
        offset = 0
        for tensor in tensors:
            tensor.copy_(flat[offset:offset + tensor.numel()].view_as(tensor))
            offset += tensor.numel()
        nbytes = flat.numel() * flat.element_size()
        setattr(self.stats, f"{kind}_bytes", getattr(self.stats, f"{kind}_bytes") + nbytes)
        self.stats.per_group_bytes[group] = self.stats.per_group_bytes.get(group, 0) + nbytes
        self.stats.calls += 1

    def before_step(self) -> None:
        """Average the gradients of every interval-1 group (plain DDP for them). Call after ``backward``."""
        for group, params in self.groups.items():
            if self.intervals[group] == 1:
                grads = [param.grad for param in params if param.grad is not None]
                self._average(grads, group, "gradient")

    @torch.no_grad()
    def after_step(self) -> None:
        """Count the optimizer step; average the weights of each interval-``k`` group every ``k``-th step."""
        self.step += 1
        for group, params in self.groups.items():
            interval = self.intervals[group]
            if interval > 1 and self.step % interval == 0:
                self._average([param.data for param in params], group, "parameter")


# ------------------------------------------------------------------------------------------------ profiling
def profile_gradient_change(model: nn.Module, loss_fns: Sequence[Callable[[], torch.Tensor]],
                            group_of: Callable[[str], str] = default_group_of,
                            optimizer: Optional[torch.optim.Optimizer] = None) -> dict[str, float]:
    """Mean relative change of each group's gradient between consecutive steps, ``‖g_t − g_{t−1}‖ / ‖g_{t−1}‖``.

    ``loss_fns[t]()`` is step ``t``'s loss (one process, e.g. the first steps of the run); with an ``optimizer``
    the model is also updated after each step, so the rates include the drift of training itself.
    """
    if len(loss_fns) < 2:
        raise ValueError("profiling needs at least two steps to measure a change")
    previous: Optional[dict[str, torch.Tensor]] = None
    totals: dict[str, float] = {}
    for loss_fn in loss_fns:
        model.zero_grad(set_to_none=True)
        loss_fn().backward()
        current = _group_gradients(model, group_of)
        if previous is not None:
            for group, grad in current.items():
                change = float((grad - previous[group]).norm()) / max(float(previous[group].norm()), 1e-12)
                totals[group] = totals.get(group, 0.0) + change / (len(loss_fns) - 1)
        previous = current
        if optimizer is not None:
            optimizer.step()
    model.zero_grad(set_to_none=True)
    return totals


def _group_gradients(model: nn.Module, group_of: Callable[[str], str]) -> dict[str, torch.Tensor]:
    pieces: dict[str, list[torch.Tensor]] = {}
    for name, param in model.named_parameters():
        if param.grad is not None:
            pieces.setdefault(group_of(name), []).append(param.grad.detach().reshape(-1).clone())
    return {group: torch.cat(parts) for group, parts in pieces.items()}


def propose_intervals(change_rates: Mapping[str, float],
                      candidates: Sequence[int] = (1, 2, 5, 10)) -> dict[str, int]:
    """Sort groups by gradient change rate and split them into ``len(candidates)`` equal bins: the fastest-changing
    bin gets ``candidates[0]`` (sync every step), the slowest ``candidates[-1]``."""
    if not change_rates:
        raise ValueError("no gradient change rates to propose intervals from")
    ordered = sorted(change_rates, key=lambda group: change_rates[group], reverse=True)
    bins = len(candidates)
    return {group: int(candidates[min(bins - 1, index * bins // len(ordered))]) for index, group in enumerate(ordered)}
