"""Tensor-parallel slicing rules: which part of each Hugging Face parameter a generation TP rank holds.

The rules follow the Megatron/vLLM split of a Llama/Qwen2/Mistral decoder:

============================  ==========================  ===========================================
HF module (leaf name)         kind                        TP rank ``j`` of ``t_g`` holds
============================  ==========================  ===========================================
``q_proj`` (+ bias)           column (dim 0, by heads)    heads ``j·H/t_g .. (j+1)·H/t_g``
``k_proj``, ``v_proj`` (+b)   column (dim 0, by KV head)  as q; if ``H_kv < t_g``: KV head ``j // (t_g/H_kv)``
``gate_proj``, ``up_proj``    column (dim 0)              rows ``j·I/t_g .. (j+1)·I/t_g``
``o_proj``                    row (dim 1, by heads)       input columns of heads ``j·H/t_g ..``
``down_proj``                 row (dim 1)                 input columns ``j·I/t_g ..``
``embed_tokens``, ``lm_head`` vocab (dim 0, padded)       rows ``[j·P, (j+1)·P) ∩ [0, V)``, ``P = pad(V)/t_g``
``*norm`` / row-parallel bias replicated                  the whole tensor
============================  ==========================  ===========================================

GQA with fewer KV heads than ``t_g`` replicates each KV head on ``t_g / H_kv`` consecutive TP ranks, as vLLM does; if
``t_g`` is not a multiple of ``H_kv`` the rule refuses with a ``ValueError`` naming the parameter. Vocab-parallel
tensors are padded to a multiple of ``vocab_pad_multiple`` (vLLM's default 64) before splitting, so the last ranks
may hold fewer (or zero) real rows — exactly the rows vLLM's loader narrows out of the full tensor.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence

Box = tuple[tuple[int, int], ...]
"""A rectangular region of a tensor: one ``(start, stop)`` per dimension, in elements."""

VLLM_VOCAB_PAD_MULTIPLE = 64


@dataclass(frozen=True)
class SplitRule:
    """How one parameter is split over the ``t_g`` ranks of a tensor-parallel group.

    ``dim=None`` replicates the tensor on every TP rank. Otherwise ``dim`` is cut into ``t_g`` equal parts made of
    whole ``unit``s (``unit = head_dim`` for attention projections, so no head is split). ``replicate_units`` lets a
    tensor with fewer units than ``t_g`` (GQA KV heads) give each unit to ``t_g / units`` ranks. ``pad_multiple > 1``
    is vocab-parallel padding: the dim is rounded up to that multiple before splitting and the tail parts are short.
    """

    dim: Optional[int] = None
    unit: int = 1
    replicate_units: bool = False
    pad_multiple: int = 1

    @property
    def kind(self) -> str:
        if self.dim is None:
            return "replicated"
        return "vocab" if self.pad_multiple > 1 else ("column" if self.dim == 0 else "row")


REPLICATED = SplitRule()

RuleFn = Callable[[str, Sequence[int]], SplitRule]
"""``rule(hf_name, full_shape) -> SplitRule``."""


@dataclass(frozen=True)
class TpSlices:
    """The resolved split of one parameter: ``boxes[j]`` is TP rank ``j``'s region of the full tensor.

    ``num_parts`` is the number of distinct regions (``t_g``, ``H_kv`` under KV replication, 1 when replicated).
    """

    rule: SplitRule
    boxes: tuple[Box, ...]
    num_parts: int


def full_box(shape: Sequence[int]) -> Box:
    return tuple((0, size) for size in shape)


def resolve_split(name: str, shape: Sequence[int], rule: SplitRule, tp_size: int) -> TpSlices:
    """Each TP rank's region of the full ``shape`` under ``rule``; ``ValueError`` naming ``name`` when impossible."""
    shape = tuple(int(size) for size in shape)
    if rule.dim is None or tp_size == 1:
        return TpSlices(rule, tuple(full_box(shape) for _ in range(tp_size)), 1)
    if rule.dim >= len(shape):
        raise ValueError(f"parameter {name!r} of shape {shape}: split dim {rule.dim} does not exist")
    size = shape[rule.dim]
    if rule.pad_multiple > 1:
        ranges, num_parts = _padded_ranges(name, size, rule.pad_multiple, tp_size), tp_size
    else:
        ranges, num_parts = _unit_ranges(name, size, rule, tp_size)
    boxes = tuple(full_box(shape)[:rule.dim] + (span,) + full_box(shape)[rule.dim + 1:] for span in ranges)
    return TpSlices(rule, boxes, num_parts)


def _padded_ranges(name: str, size: int, pad_multiple: int, tp_size: int) -> list[tuple[int, int]]:
    padded = -(-size // pad_multiple) * pad_multiple
    if padded % tp_size:
        raise ValueError(f"parameter {name!r}: vocab size {size} padded to {padded} is not divisible by "
                         f"tensor-parallel size t_g={tp_size}")
    per_rank = padded // tp_size
    return [(min(j * per_rank, size), min((j + 1) * per_rank, size)) for j in range(tp_size)]


def _unit_ranges(name: str, size: int, rule: SplitRule, tp_size: int) -> tuple[list[tuple[int, int]], int]:
    what = "heads" if rule.unit > 1 else "rows" if rule.dim == 0 else "columns"
    if size % rule.unit:
        raise ValueError(f"parameter {name!r}: dim {rule.dim} of size {size} is not a whole number of "
                         f"{rule.unit}-wide heads")
    num_units = size // rule.unit
    if num_units % tp_size == 0:
        per_rank = size // tp_size
        return [(j * per_rank, (j + 1) * per_rank) for j in range(tp_size)], tp_size
    if rule.replicate_units and num_units < tp_size and tp_size % num_units == 0:
        copies = tp_size // num_units  # vLLM's num_kv_head_replicas
        return [((j // copies) * rule.unit, (j // copies + 1) * rule.unit) for j in range(tp_size)], num_units
    hint = " (nor is t_g a multiple of it, which KV-head replication needs)" if rule.replicate_units else ""
    raise ValueError(f"parameter {name!r}: dim {rule.dim} has {num_units} {what}, not divisible by "
                     f"tensor-parallel size t_g={tp_size}{hint}")


def decoder_rules(head_dim: int, vocab_pad_multiple: int = VLLM_VOCAB_PAD_MULTIPLE) -> RuleFn:
    """The rule function for Llama/Qwen2/Mistral-style HF decoders (table in the module docstring).

    Args:
        head_dim: attention head size in elements (attention splits never cut a head).
        vocab_pad_multiple: vLLM's vocab padding (64); 1 demands ``V % t_g == 0``.
    Raises ``ValueError`` for a parameter it does not know (pass your own ``RuleFn`` for other architectures).
    """
    column_heads = SplitRule(dim=0, unit=head_dim)
    by_module = {
        "q_proj": column_heads,
        "k_proj": SplitRule(dim=0, unit=head_dim, replicate_units=True),
        "v_proj": SplitRule(dim=0, unit=head_dim, replicate_units=True),
        "o_proj": SplitRule(dim=1, unit=head_dim),
        "gate_proj": SplitRule(dim=0), "up_proj": SplitRule(dim=0), "down_proj": SplitRule(dim=1),
        "embed_tokens": SplitRule(dim=0, pad_multiple=vocab_pad_multiple),
        "lm_head": SplitRule(dim=0, pad_multiple=vocab_pad_multiple),
    }

    def rule(name: str, shape: Sequence[int]) -> SplitRule:
        parts = name.split(".")
        module = parts[-2] if len(parts) >= 2 else parts[-1]
        if module.endswith("norm"):
            return REPLICATED
        if module not in by_module:
            raise ValueError(f"no tensor-parallel rule for parameter {name!r}: pass a rule function for this "
                             f"architecture (hybridrl.hybrid_engine.tp_rules.RuleFn)")
        chosen = by_module[module]
        if len(shape) == 1 and chosen.dim == 1:
            return REPLICATED  # the bias of a row-parallel layer is added once, after the all-reduce: whole tensor
        return chosen

    return rule


def rules_for_config(config, vocab_pad_multiple: int = VLLM_VOCAB_PAD_MULTIPLE) -> RuleFn:
    """``decoder_rules`` with ``head_dim`` read from a Hugging Face config (``head_dim`` or hidden / heads)."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return decoder_rules(int(head_dim), vocab_pad_multiple)


SLICE_RULE_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3", "granite", "gemma", "gemma2",
                                    "gemma3_text"})
"""Model types whose parameters :func:`decoder_rules` splits exactly as vLLM's loaders narrow them — checked by the
architecture test (``tests/e2e/test_architectures.py``: rollout and trainer log-probs agree at ``t_g = 2``). Other
architectures receive whole tensors: correct for every one vLLM loads, ``t_g`` times the bytes per replica."""


def full_tensor_rule(name: str, shape: Sequence[int]) -> SplitRule:
    """Every parameter whole on every tensor-parallel rank (the engine's loaders narrow their part themselves)."""
    return REPLICATED


def rules_for_model(config, *, converted: bool) -> tuple[RuleFn, str]:
    """The split an engine receives, and why: tensor-parallel slices (:func:`rules_for_config`) for the model types
    in :data:`SLICE_RULE_MODEL_TYPES` whose parameters are held as the checkpoint holds them; else whole tensors
    (``converted``: some parameter must be reverted to the checkpoint's form, which needs all of it)."""
    model_type = getattr(config, "model_type", None)
    if converted:
        return full_tensor_rule, "whole tensors: some weights are held in another form than the checkpoint's"
    if model_type not in SLICE_RULE_MODEL_TYPES:
        return full_tensor_rule, f"whole tensors: no tensor-parallel slice rules for model_type {model_type!r}"
    return rules_for_config(config), "tensor-parallel slices"
