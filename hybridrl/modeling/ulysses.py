"""Ulysses sequence parallelism: the ranks of a sequence-parallel group split every sequence between them.

``SP`` ranks run one forward on the *same* rows. Between the layers each rank holds ``1/SP`` of the positions
(``[B, L/SP, D]`` hidden states: activations shrink ``SP`` times); inside attention an all-to-all trades the split
for one over heads — each rank attends over the whole sequence for ``H/SP`` of the heads — and a second all-to-all
trades it back (DeepSpeed-Ulysses, arXiv:2309.14509). After the last layer the hidden states are gathered, so the
final norm, the head and the loss see whole rows, exactly as without sequence parallelism.

How it hooks into a Hugging Face decoder (:func:`install_ulysses`), without touching its code:

- the decoder's pre-hook pads the sequence to a multiple of ``SP`` (at the end: a causal model's real positions never
  see it) and tags the call with a :class:`UlyssesCall`, a keyword that transformers passes on to every layer and to
  the attention function — so the masks and rotary embeddings are built for whole rows, as usual;
- each layer's pre-hook keeps this rank's slice of the positions (hidden states at the first layer, the rotary
  embeddings at every layer); the last layer's hook gathers the slices back, and the decoder's hook drops the padding;
- the attention function registered as ``hybridrl_ulysses:<inner>`` runs the all-to-alls around the model's own
  kernel ``<inner>`` (sdpa, eager, the CPU kernel, flash-attn), giving it the whole-row mask.

Every hook decides from its own inputs, so activation checkpointing's recomputation repeats the same collectives.
Calls with a KV cache (generation) run as if there were no group.

Gradients: every rank of the group computes the same loss from the gathered rows; the gather's backward sums the
group's gradients, so each rank's parameter gradients sum over the group to ``SP ×`` the whole-row gradient. FSDP2
averages over all ``DP × SP`` ranks, so a loss scaled by the *data-parallel* size (``× dp.size``, the engine's rule,
with ``dp`` the group of ranks holding different rows) gives exactly the gradient of the data-parallel sum.
"""

from __future__ import annotations

import copy
import functools
import inspect
import math
import sys
from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.distributed as dist
from torch import nn

from hybridrl.modeling.model_builder import decoder_layers

ULYSSES_PREFIX = "hybridrl_ulysses:"
CALL_KEYWORD = "hybridrl_ulysses"
"""The keyword a sequence-parallel forward passes down to the layers and the attention function."""


@dataclass(frozen=True)
class SequenceParallelGroup:
    """The ranks that split each sequence: ``group`` (``None``: no split), this rank's place in it, its size."""

    group: Optional[dist.ProcessGroup] = None
    rank: int = 0
    size: int = 1


@dataclass(frozen=True)
class UlyssesCall:
    """One sequence-parallel forward: its group, the padded length ``length`` (a multiple of the group's size), the
    whole rows' ``position_ids [B, length]`` (flash-attn reads packed sequences from them) and the length before
    padding, ``real_length``."""

    sp: SequenceParallelGroup
    length: int
    position_ids: Optional[torch.Tensor]
    real_length: int

    @property
    def local_length(self) -> int:
        return self.length // self.sp.size

    def local(self, tensor: torch.Tensor, dim: int = 1) -> torch.Tensor:
        """This rank's slice of ``tensor`` along ``dim`` (the positions)."""
        return tensor.narrow(dim, self.sp.rank * self.local_length, self.local_length)


@dataclass(frozen=True)
class SequenceParallelLayout:
    """A rank's two groups when ``world = DP × SP`` ranks are laid out row-major ``[DP, SP]``: ranks ``d·SP …
    d·SP + SP − 1`` split the same rows (``sp``); the ranks with this rank's place in their group hold different
    rows (``dp_group`` of ``dp_size``, this rank ``dp_rank`` in it; ``None`` when ``dp_size`` is 1)."""

    sp: SequenceParallelGroup
    dp_group: Optional[dist.ProcessGroup]
    dp_rank: int
    dp_size: int


def sequence_parallel_layout(sp_size: int, key: str = "ulysses_sequence_parallel_size") -> SequenceParallelLayout:
    """This rank's groups (:class:`SequenceParallelLayout`) over the default process group; every rank must call it
    (each new group is a collective). ``sp_size`` 1: no split, every rank its own rows."""
    world, rank = dist.get_world_size(), dist.get_rank()
    if sp_size < 1 or world % sp_size:
        raise ValueError(f"{key}={sp_size} must divide the {world} ranks of the group")
    if sp_size == 1:
        return SequenceParallelLayout(SequenceParallelGroup(), dist.group.WORLD if world > 1 else None, rank, world)
    dp_size = world // sp_size
    sp_groups = [dist.new_group(list(range(d * sp_size, (d + 1) * sp_size))) for d in range(dp_size)]
    dp_groups = [dist.new_group(list(range(j, world, sp_size))) for j in range(sp_size)] if dp_size > 1 else None
    sp = SequenceParallelGroup(sp_groups[rank // sp_size], rank % sp_size, sp_size)
    return SequenceParallelLayout(sp, dp_groups[rank % sp_size] if dp_groups else None, rank // sp_size, dp_size)


def check_heads(config, sp_size: int, key: str = "ulysses_sequence_parallel_size") -> None:
    """Refuse a model whose attention heads ``sp_size`` does not divide (each rank attends with ``heads / SP``)."""
    heads = getattr(config, "num_attention_heads", None)
    if heads is None:
        raise ValueError(f"{key}={sp_size}: the model's config has no num_attention_heads to split")
    if heads % sp_size:
        raise ValueError(f"{key}={sp_size} must divide the model's {heads} attention heads (each rank of a "
                         f"sequence-parallel group attends with heads / {key} of them)")


def install_ulysses(model: nn.Module, sp: SequenceParallelGroup) -> None:
    """Make ``model`` (a Hugging Face decoder model, a PEFT wrapper looked through) run every cache-less forward
    split over ``sp`` (module docstring). Idempotent; a group of one installs nothing."""
    if sp.size <= 1 or getattr(model, "_hybridrl_ulysses", None) is not None:
        return
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    check_heads(base.config, sp.size)
    decoder, layers = _decoder_and_layers(base)
    _use_ulysses_attention(base)
    decoder.register_forward_pre_hook(functools.partial(_decoder_pre_hook, sp=sp), with_kwargs=True)
    decoder.register_forward_hook(_decoder_post_hook, with_kwargs=True)
    for index, layer in enumerate(layers):
        layer.register_forward_pre_hook(functools.partial(_layer_pre_hook, first=index == 0), with_kwargs=True)
    layers[-1].register_forward_hook(_last_layer_hook, with_kwargs=True)
    model._hybridrl_ulysses = sp


def _decoder_and_layers(model: nn.Module) -> tuple[nn.Module, list[nn.Module]]:
    """The module that runs the layer stack (its ``forward`` takes ``input_ids`` and builds the masks) and the stack's
    blocks — the ones FSDP2 shards and checkpointing wraps (:func:`~hybridrl.modeling.model_builder.decoder_layers`)."""
    layers = decoder_layers(model)
    for module in model.modules():
        stack = getattr(module, "layers", None)
        if isinstance(stack, nn.ModuleList) and hasattr(module, "embed_tokens") and any(
                block is layers[0] for block in stack):
            return module, layers
    raise ValueError(f"sequence parallelism needs a decoder with embed_tokens and layers; "
                     f"{type(model).__name__} has none")


def _use_ulysses_attention(model: nn.Module) -> None:
    """Switch the model's attention to ``hybridrl_ulysses:<its kernel>`` (registered with transformers here)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    inner = model.config._attn_implementation
    if inner.startswith(ULYSSES_PREFIX):
        return
    name = ULYSSES_PREFIX + inner
    AttentionInterface.register(name, functools.partial(ulysses_attention_forward, inner=inner))
    ALL_MASK_ATTENTION_FUNCTIONS.register(name, ALL_MASK_ATTENTION_FUNCTIONS[_mask_kind(inner)])
    model.set_attn_implementation(name)


def _mask_kind(inner: str) -> str:
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    return inner if inner in ALL_MASK_ATTENTION_FUNCTIONS else "sdpa"  # the CPU kernel takes sdpa's masks


def _decoder_pre_hook(module: nn.Module, args: tuple, kwargs: dict, *, sp: SequenceParallelGroup):
    if args:  # e.g. a classifier passes input_ids positionally: name every argument
        kwargs, args = _named_arguments(module.forward, args, kwargs), ()
    if kwargs.get("past_key_values") is not None or kwargs.get("use_cache"):
        return None  # a KV cache: a generation call, not split
    ids = kwargs.get("input_ids")
    if ids is None:
        raise ValueError("sequence parallelism needs input_ids (inputs_embeds are not split yet)")
    length = ids.shape[1]
    padded = math.ceil(length / sp.size) * sp.size
    positions = kwargs.get("position_ids")
    if positions is None:
        positions = torch.arange(length, device=ids.device).expand(ids.shape[0], -1)
    extra = padded - length
    if extra:
        kwargs["input_ids"] = torch.nn.functional.pad(ids, (0, extra))
        # the padding is a sequence of its own after the last real token (causal: no real position sees it)
        tail = torch.arange(extra, device=ids.device).expand(positions.shape[0], -1)
        positions = torch.cat([positions, tail.to(positions.dtype)], dim=1)
        mask = kwargs.get("attention_mask")
        if mask is not None and mask.dim() != 2:
            raise ValueError("sequence parallelism pads [B, L] attention masks; got a custom "
                             f"{mask.dim()}-D mask (e.g. model.share_prompts' rows, which it does not use)")
        if mask is not None:
            kwargs["attention_mask"] = torch.nn.functional.pad(mask, (0, extra))
    kwargs["position_ids"] = positions
    kwargs[CALL_KEYWORD] = UlyssesCall(sp, padded, positions, length)
    return args, kwargs


def _named_arguments(function, args: tuple, kwargs: dict) -> dict:
    """``function``'s positional ``args`` and ``kwargs`` as one keyword dict (its ``**`` parameter's entries merged)."""
    signature = inspect.signature(function)
    named = dict(signature.bind_partial(*args, **kwargs).arguments)
    for parameter in signature.parameters.values():
        if parameter.kind is inspect.Parameter.VAR_KEYWORD:
            named.update(named.pop(parameter.name, {}))
    return named


def _decoder_post_hook(module: nn.Module, args: tuple, kwargs: dict, output: Any):
    call: Optional[UlyssesCall] = kwargs.get(CALL_KEYWORD)
    if call is None:
        return None
    output.last_hidden_state = output.last_hidden_state[:, :call.real_length]
    return output


def _layer_pre_hook(module: nn.Module, args: tuple, kwargs: dict, *, first: bool):
    call: Optional[UlyssesCall] = kwargs.get(CALL_KEYWORD)
    if call is None:
        return None
    if first:  # a copy, so that what the layer saves for backward does not keep every position's embedding alive
        if args:
            args = (call.local(args[0]).clone(), *args[1:])
        else:
            kwargs["hidden_states"] = call.local(kwargs["hidden_states"]).clone()
    embeddings = kwargs.get("position_embeddings")
    if embeddings is not None:
        kwargs["position_embeddings"] = _local_positions(embeddings, call)
    if kwargs.get("position_ids") is not None:
        kwargs["position_ids"] = call.local(kwargs["position_ids"], dim=-1)
    return args, kwargs


def _local_positions(embeddings: Any, call: UlyssesCall) -> Any:
    """This rank's slice of rotary embeddings (``(cos, sin)`` of ``[B, L, d]``), which every layer receives whole."""
    if isinstance(embeddings, torch.Tensor):
        return call.local(embeddings, dim=-2) if embeddings.shape[-2] == call.length else embeddings
    if isinstance(embeddings, (tuple, list)):
        return type(embeddings)(_local_positions(part, call) for part in embeddings)
    raise ValueError(f"sequence parallelism slices rotary embeddings given as tensors or (cos, sin) pairs; this "
                     f"model passes its layers a {type(embeddings).__name__}")


def _last_layer_hook(module: nn.Module, args: tuple, kwargs: dict, output: Any):
    call: Optional[UlyssesCall] = kwargs.get(CALL_KEYWORD)
    if call is None:
        return None
    if isinstance(output, tuple):
        return (gather_positions(output[0], call), *output[1:])
    return gather_positions(output, call)


def gather_positions(hidden: torch.Tensor, call: UlyssesCall) -> torch.Tensor:
    """``[B, L/SP, D]`` slices of the group → ``[B, L, D]`` on every rank; the backward sums the group's gradients
    and keeps this rank's slice."""
    return _Gather.apply(hidden, call.sp.group, call.sp.size, call.sp.rank, 1)


def sequence_parallel_of(model: nn.Module) -> Optional[SequenceParallelGroup]:
    """The group ``model``'s forwards split sequences over (:func:`install_ulysses`), or ``None``."""
    return getattr(model, "_hybridrl_ulysses", None)


def rows_of_rank(rows: torch.Tensor, sp: SequenceParallelGroup) -> torch.Tensor:
    """This rank's share of ``rows [M, ...]``: the ``r``-th of ``SP`` chunks of ``ceil(M / SP)`` rows, zero rows
    appended to the last ones so every rank has as many (:func:`gather_rows` drops them)."""
    chunk = -(-rows.shape[0] // sp.size)
    start = min(sp.rank * chunk, rows.shape[0])
    mine = rows[start:start + chunk]
    if mine.shape[0] < chunk:
        mine = torch.cat([mine, mine.new_zeros((chunk - mine.shape[0], *rows.shape[1:]))])
    return mine


def gather_rows(mine: torch.Tensor, sp: SequenceParallelGroup, total: int) -> torch.Tensor:
    """Every rank's :func:`rows_of_rank` share back into the ``[total, ...]`` rows, on every rank (the backward sums
    the group's gradients and keeps this rank's share, as :func:`gather_positions`)."""
    return _Gather.apply(mine, sp.group, sp.size, sp.rank, 0)[:total]


def ulysses_attention_forward(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                              attention_mask: Optional[torch.Tensor], *, inner: str,
                              **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention contract (``query [B, H, q, D]``, ``key``/``value [B, H_kv, k, D]`` →
    ``([B, q, H, D], weights)``) with the positions split over a group: heads are scattered and positions gathered
    by an all-to-all, ``inner`` attends over whole rows for ``H/SP`` heads, and a second all-to-all brings back
    this rank's positions for every head. Without a :class:`UlyssesCall` it is ``inner`` itself."""
    call: Optional[UlyssesCall] = kwargs.pop(CALL_KEYWORD, None)
    attend = _attention_function(module, inner)
    if call is None:
        return attend(_InnerView(module, inner), query, key, value, attention_mask, **kwargs)
    size, group = call.sp.size, call.sp.group
    key, value = _kv_heads_divisible(key, size), _kv_heads_divisible(value, size)
    query, key, value = (_heads_to_positions(tensor, size, group) for tensor in (query, key, value))
    if kwargs.get("position_ids") is not None:
        kwargs["position_ids"] = call.position_ids
    view = _InnerView(module, inner, groups=query.shape[1] // key.shape[1])
    output, _ = attend(view, query, key, value, attention_mask, **kwargs)
    return _positions_to_heads(output, size, group), None


def _attention_function(module: nn.Module, inner: str):
    """The kernel ``inner`` names: a registered one, or for ``eager`` the modeling file's own function (as the
    attention module itself picks it)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if inner in ALL_ATTENTION_FUNCTIONS:
        return ALL_ATTENTION_FUNCTIONS[inner]
    eager = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
    if eager is None:
        raise ValueError(f"sequence parallelism: no attention function {inner!r} for {type(module).__name__}")
    return eager


def _kv_heads_divisible(tensor: torch.Tensor, size: int) -> torch.Tensor:
    """``[B, H_kv, L, D]`` with each KV head repeated so that ``size`` divides their number (query heads keep their
    KV head: head ``h`` of ``H = g·H_kv`` reads KV head ``h // g``, and after ``r`` repeats copy ``h·r // g``)."""
    heads = tensor.shape[1]
    repeats = size // math.gcd(heads, size)
    return tensor if repeats == 1 else tensor.repeat_interleave(repeats, dim=1)


def _heads_to_positions(tensor: torch.Tensor, size: int, group) -> torch.Tensor:
    """``[B, H, L/SP, D]`` (all heads, this rank's positions) → ``[B, H/SP, L, D]`` (this rank's heads, all
    positions)."""
    batch, heads, local, dim = tensor.shape
    send = tensor.reshape(batch, size, heads // size, local, dim).transpose(0, 1).contiguous()
    received = _AllToAll.apply(send, group)
    return received.permute(1, 2, 0, 3, 4).reshape(batch, heads // size, size * local, dim)


def _positions_to_heads(tensor: torch.Tensor, size: int, group) -> torch.Tensor:
    """``[B, L, H/SP, D]`` (attention's output layout, this rank's heads) → ``[B, L/SP, H, D]``."""
    batch, length, heads, dim = tensor.shape
    local = length // size
    send = tensor.reshape(batch, size, local, heads, dim).transpose(0, 1).contiguous()
    received = _AllToAll.apply(send, group)
    return received.permute(1, 2, 0, 3, 4).reshape(batch, local, size * heads, dim)


class _InnerView:
    """An attention module as its kernel ``inner`` must see it: a ``config`` naming ``inner`` as the attention
    implementation (flash-attn's wrapper loads its kernel by that name, which the ``hybridrl_ulysses:`` one is not)
    and, on a split, ``num_key_value_groups`` of this rank's share of heads (repeats of KV heads change it);
    everything else is the module's."""

    def __init__(self, module: nn.Module, inner: str, groups: Optional[int] = None) -> None:
        self._module = module
        self.config = _config_naming(module, inner)
        if groups is not None:
            self.num_key_value_groups = groups

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)


def _config_naming(module: nn.Module, inner: str):
    """A shallow copy of ``module.config`` whose attention implementation is ``inner``, made once per module (kept
    on the module, not the config, which would save it with the model)."""
    cached = module.__dict__.get("_hybridrl_inner_config")
    if cached is None or cached._attn_implementation != inner:
        cached = copy.copy(module.config)
        cached._attn_implementation = inner
        module.__dict__["_hybridrl_inner_config"] = cached
    return cached


class _AllToAll(torch.autograd.Function):
    """``[SP, ...]``: block ``j`` goes to rank ``j``, block ``i`` of the result came from rank ``i``; the backward is
    the same exchange in reverse (its own inverse)."""

    @staticmethod
    def forward(ctx, send: torch.Tensor, group) -> torch.Tensor:
        ctx.group = group
        return _exchange(send, group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return _exchange(grad, ctx.group), None


def _exchange(send: torch.Tensor, group) -> torch.Tensor:
    # the buffer is made contiguous whatever ``send``'s strides (a gradient is often a permuted view): the
    # collective writes it as flat memory
    send = send.contiguous()
    received = torch.empty(send.shape, dtype=send.dtype, device=send.device)
    dist.all_to_all_single(received, send, group=group)
    return received


class _Gather(torch.autograd.Function):
    """Equal slices of the group along ``dim`` → the whole tensor (slices in rank order); the backward sums the
    gradients of the group (an all-reduce: gloo has no reduce-scatter) and keeps this rank's slice."""

    @staticmethod
    def forward(ctx, part: torch.Tensor, group, size: int, rank: int, dim: int) -> torch.Tensor:
        ctx.group, ctx.rank, ctx.dim, ctx.local = group, rank, dim, part.shape[dim]
        part = part.contiguous()
        parts = [torch.empty(part.shape, dtype=part.dtype, device=part.device) for _ in range(size)]
        dist.all_gather(parts, part, group=group)
        return torch.cat(parts, dim=dim)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad.narrow(ctx.dim, ctx.rank * ctx.local, ctx.local).contiguous(), None, None, None, None
