"""MoE routing: record which experts each token was routed to, and replay a recorded routing in another forward.

Routing replay (R3) makes the trainer's forwards route every token to the experts the rollout routed it to: the
top-k choice is taken from the record, while the gate weights are the trainer's own router probabilities at those
experts (renormalised as the model does), so gradients still reach the router. Without it, a token whose router
scores are near a tie can go to other experts in the trainer than in the rollout, and the importance ratio compares
two different computations — the cause the field found for MoE RL runs collapsing.

The hook point is transformers' top-k router module (``MixtralTopKRouter``, ``Qwen3MoeTopKRouter``, …): a module
with ``top_k`` and a ``weight`` whose forward returns ``(router_logits [T, E], scores [T, k], indices [T, k])`` for the
``T`` tokens of the call, in the order the MoE block flattened them (row-major over ``[B, L]``).

Two ways in:

- :func:`recorded_routing` / :func:`replayed_routing`: context managers over one forward's router calls (one
  forward's tokens in, the same tokens' experts out) — what the rollout records with;
- :func:`install_routing_replay`: hooks installed once on a training model, driven by a forward keyword,
  ``ROUTING_KEYWORD = [B, L, routers, k]`` expert indices aligned with the decoder's ``input_ids [B, L]`` (``-1``:
  the router's own choice, e.g. at padding). Transformers passes the keyword down to every decoder layer, so a
  checkpointed layer's recomputation replays the same routing, and a sequence-parallel rank (Ulysses) takes its own
  share of the positions. The hooks also count how often the router's own top-k equals the record
  (:class:`RoutingReplayState`): the agreement metric, with or without replay.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Optional, Sequence

import torch
import torch.distributed as dist
from torch import nn

from hybridrl.modeling.model_builder import decoder_layers
from hybridrl.modeling.ulysses import CALL_KEYWORD

ROUTING_KEYWORD = "hybridrl_routed_experts"
"""The forward keyword carrying the experts to replay: ``[B, L, routers, k]`` indices aligned with ``input_ids``."""
NOT_RECORDED = -1
"""An expert index meaning "no record here: the router chooses" (padding, tokens the rollout never ran)."""


def routers(model: nn.Module) -> list[nn.Module]:
    """The model's top-k router modules, in layer order (empty for a dense model)."""
    return [module for module in model.modules()
            if type(module).__name__.endswith("TopKRouter") and hasattr(module, "top_k")
            and isinstance(getattr(module, "weight", None), torch.Tensor)]


def require_routers(model: nn.Module) -> list[nn.Module]:
    """:func:`routers`, refusing (``ValueError``) a model that has none."""
    found = routers(model)
    if not found:
        raise ValueError(f"routing replay needs a mixture-of-experts model with top-k routers; "
                         f"{type(model).__name__} has none (a dense model routes nothing)")
    return found


@contextlib.contextmanager
def recorded_routing(model: nn.Module) -> Iterator[list[list[torch.Tensor]]]:
    """``with recorded_routing(model) as record:`` — ``record[layer]`` collects the ``[T, k]`` expert indices of every
    forward call of that layer's router inside the block, in call order."""
    found = require_routers(model)
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
    found = require_routers(model)
    if len(experts) != len(found):
        raise ValueError(f"routing replay: {len(experts)} layers of recorded experts for a model with "
                         f"{len(found)} routers")
    # prepended: any other hook on the router (a recorder) sees the replayed routing
    handles = [router.register_forward_hook(
        lambda module, args, output, chosen=chosen: _replayed(
            module, output, _aligned(chosen, output[2], "the replayed forward must see the recorded tokens")),
        prepend=True)
        for router, chosen in zip(found, experts)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _aligned(chosen: torch.Tensor, indices: torch.Tensor, hint: str) -> torch.Tensor:
    """``chosen [T, k]`` on ``indices``' device and dtype; a record of another shape is refused (``hint``: why)."""
    if chosen.shape != indices.shape:
        raise ValueError(f"routing replay: recorded experts {tuple(chosen.shape)} for a router call that routes "
                         f"{tuple(indices.shape)} (tokens × top-k): {hint}")
    return chosen.to(indices.device, indices.dtype)


def _same_experts(first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
    """``[T]``: whether each token's top-k experts are the same set in ``first`` and ``second`` (``[T, k]`` each)."""
    return (first.sort(dim=-1).values == second.sort(dim=-1).values).all(dim=-1)


def _replayed(router: nn.Module, output: tuple, chosen: torch.Tensor) -> tuple:
    """The router's ``output`` routed to ``chosen`` (aligned ``[T, k]``; a row with a −1: its own choice)."""
    logits, scores, indices = output
    chosen = torch.where((chosen < 0).any(dim=-1, keepdim=True), indices, chosen)  # unrecorded: its own choice
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
        same += int(_same_experts(a, b).sum())
        total += a.shape[0]
    return same / total if total else 1.0


@dataclass
class RoutingReplayState:
    """What :func:`install_routing_replay` keeps on a model: whether recorded routing is replayed (``replay``;
    ``False``: only compared) and the agreement counts since :meth:`reset` — recorded (token, router) pairs seen and
    how many of them the router's own top-k matched as a set."""

    replay: bool = True
    matched: int = 0
    recorded: int = 0

    def reset(self) -> None:
        self.matched = self.recorded = 0

    def agreement(self, group: Optional[dist.ProcessGroup] = None) -> Optional[float]:
        """The matched fraction over ``group``'s ranks (all ranks must call it with a group); ``None``: nothing
        recorded was routed."""
        counts = torch.tensor([self.matched, self.recorded], dtype=torch.float64)
        if group is not None:
            dist.all_reduce(counts, group=group)
        return float(counts[0] / counts[1]) if counts[1] else None


def install_routing_replay(model: nn.Module, *, replay: bool = True) -> RoutingReplayState:
    """Make ``model`` (a PEFT wrapper looked through) route by ``ROUTING_KEYWORD`` whenever a forward passes it
    (module docstring); ``replay=False`` only counts the agreement. Idempotent (the installed state is returned, its
    ``replay`` set). Refuses a dense model."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    state = getattr(base, "_hybridrl_routing_replay", None)
    if state is not None:
        state.replay = replay
        return state
    found = require_routers(base)
    state = RoutingReplayState(replay=replay)
    for layer in decoder_layers(base):
        columns = [(found.index(module), module) for module in layer.modules() if any(module is r for r in found)]
        if columns:
            layer.register_forward_pre_hook(functools.partial(_hand_out_routing, columns=columns), with_kwargs=True)
    for router in found:
        router.register_forward_hook(functools.partial(_route_as_recorded, state=state))
    base._hybridrl_routing_replay = state
    return state


def routing_replay_of(model: nn.Module) -> Optional[RoutingReplayState]:
    """The state :func:`install_routing_replay` left on ``model``, or ``None``."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return getattr(base, "_hybridrl_routing_replay", None)


def _hand_out_routing(layer: nn.Module, args: tuple, kwargs: dict, *, columns: list[tuple[int, nn.Module]]):
    """A decoder layer's pre-hook: give each of its routers its ``[T, k]`` share of the keyword's experts (this
    rank's positions under sequence parallelism), consumed by the router's next call."""
    experts = kwargs.get(ROUTING_KEYWORD)
    if experts is None:
        for _, router in columns:  # a forward that raised before its router ran must not hand this one its record
            router._hybridrl_chosen = None
        return None
    call = kwargs.get(CALL_KEYWORD)
    for column, router in columns:
        chosen = experts[:, :, column]
        if call is not None:  # Ulysses: pad the rows as the decoder did, then this rank's slice
            chosen = torch.nn.functional.pad(chosen, (0, 0, 0, call.length - chosen.shape[1]), value=NOT_RECORDED)
            chosen = call.local(chosen)
        router._hybridrl_chosen = chosen.reshape(-1, chosen.shape[-1])
    return None


def _route_as_recorded(router: nn.Module, args: tuple, output: tuple, *, state: RoutingReplayState):
    chosen = getattr(router, "_hybridrl_chosen", None)
    if chosen is None:
        return None
    router._hybridrl_chosen = None
    chosen = _aligned(chosen, output[2], "the keyword must align with the input ids")
    recorded = (chosen >= 0).all(dim=-1)
    same = _same_experts(chosen, output[2]) & recorded
    state.matched += int(same.sum())
    state.recorded += int(recorded.sum())
    return _replayed(router, output, chosen) if state.replay else None
