"""MoE routing: record which experts each token was routed to, and replay a recorded routing in another forward.

Routing replay (R3) makes the trainer's forwards route every token to the experts the rollout routed it to: the
top-k choice is taken from the record, while the gate weights are the trainer's own router probabilities at those
experts (renormalised as the model does), so gradients still reach the router. Without it, a token whose router
scores are near a tie can go to other experts in the trainer than in the rollout, and the importance ratio compares
two different computations — the cause the field found for MoE RL runs collapsing.

The hook point is transformers' top-k router module (``MixtralTopKRouter``, ``Qwen3MoeTopKRouter``, …): a module
with ``top_k`` and a ``weight`` whose forward returns ``(router_logits [T, E], scores [T, k], indices [T, k])`` for the
``T`` tokens of the call, in the order the MoE block flattened them (row-major over ``[B, L]``).

This module is the primitive (one forward's tokens in, the same tokens' experts out); carrying a rollout's routing
into the trainer's padded, packed or sequence-parallel layouts is built on it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Sequence

import torch
from torch import nn


def routers(model: nn.Module) -> list[nn.Module]:
    """The model's top-k router modules, in layer order (empty for a dense model)."""
    return [module for module in model.modules()
            if type(module).__name__.endswith("TopKRouter") and hasattr(module, "top_k")
            and isinstance(getattr(module, "weight", None), torch.Tensor)]


def _require_routers(model: nn.Module) -> list[nn.Module]:
    found = routers(model)
    if not found:
        raise ValueError(f"routing replay needs a mixture-of-experts model with top-k routers; "
                         f"{type(model).__name__} has none (a dense model routes nothing)")
    return found


@contextlib.contextmanager
def recorded_routing(model: nn.Module) -> Iterator[list[list[torch.Tensor]]]:
    """``with recorded_routing(model) as record:`` — ``record[layer]`` collects the ``[T, k]`` expert indices of every
    forward call of that layer's router inside the block, in call order."""
    found = _require_routers(model)
    record: list[list[torch.Tensor]] = [[] for _ in found]
    handles = [router.register_forward_hook(
        lambda module, args, output, calls=calls: calls.append(output[2].detach().clone()))
        for router, calls in zip(found, record)]
    try:
        yield record
    finally:
        for handle in handles:
            handle.remove()


@contextlib.contextmanager
def replayed_routing(model: nn.Module, experts: Sequence[torch.Tensor]) -> Iterator[None]:
    """Inside the block, router ``layer``'s next forward routes its ``T`` tokens to ``experts[layer]`` (``[T, k]``
    indices) instead of its own top-k; one forward of the model per block. The scores are the router's softmax at
    those experts, renormalised where the model renormalises its top-k (``norm_topk_prob``, always for Mixtral)."""
    found = _require_routers(model)
    if len(experts) != len(found):
        raise ValueError(f"routing replay: {len(experts)} layers of recorded experts for a model with "
                         f"{len(found)} routers")
    # prepended: any other hook on the router (a recorder) sees the replayed routing
    handles = [router.register_forward_hook(
        lambda module, args, output, chosen=chosen: _replayed(module, output, chosen), prepend=True)
        for router, chosen in zip(found, experts)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _replayed(router: nn.Module, output: tuple, chosen: torch.Tensor) -> tuple:
    logits, scores, indices = output
    if chosen.shape != indices.shape:
        raise ValueError(f"routing replay: recorded experts {tuple(chosen.shape)} for a router call that routes "
                         f"{tuple(indices.shape)} (tokens × top-k): the replayed forward must see the recorded tokens")
    chosen = chosen.to(indices.device, indices.dtype)
    probabilities = torch.softmax(logits.float(), dim=-1)
    replayed = probabilities.gather(-1, chosen)
    if getattr(router, "norm_topk_prob", True):
        replayed = replayed / replayed.sum(dim=-1, keepdim=True)
    return logits, replayed.to(scores.dtype), chosen


def routing_agreement(recorded: Sequence[torch.Tensor], routed: Sequence[torch.Tensor]) -> float:
    """The fraction of (token, layer) pairs whose set of top-k experts is the same in ``routed`` as in ``recorded``
    (each a list over layers of ``[T, k]`` indices): the metric to watch when replay is off."""
    same = total = 0
    for a, b in zip(recorded, routed, strict=True):
        same += int((a.sort(dim=-1).values == b.sort(dim=-1).values).all(dim=-1).sum())
        total += a.shape[0]
    return same / total if total else 1.0
