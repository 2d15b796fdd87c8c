"""Forward passes over prompt+response sequences, padded, packed (padding removed) or with shared prompts, with
identical outputs.

Layout of a batch row (docs/architecture.md §2): ``input_ids = [left-padded prompt | right-padded response]`` of width
``T = P + R``; ``attention_mask`` marks real tokens; ``responses`` is the last ``R`` columns. The model's output at
position ``t`` scores token ``t + 1``, so the output that belongs to response token ``k`` sits at column ``P + k - 1``.

All layouts reduce to the same thing: the model outputs at the *source* positions of the valid response tokens,
as a flat ``[M, D]`` tensor (``M`` = valid response tokens in the micro-batch), plus the scatter back to ``[B, R]``.

- padded: one forward on ``[B, T']`` with the attention mask and position ids, ``T'`` without the columns that are
  padding in every row;
- shared prompts (padded, ``share_prompts``): the rows with one prompt become one row over a single copy of it
  (``hybridrl.modeling.shared_prompts``);
- packed: the valid tokens of all rows concatenated into one ``[1, N]`` row, position ids restarting at 0 for each
  sequence, no attention mask — transformers then builds a block-diagonal causal mask, so attention never crosses
  sequences, and no FLOPs are spent on pad tokens.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

from hybridrl.algorithms import token_log_probs_and_entropy
from hybridrl.modeling.multimodal import packed_vision_call, padded_vision_call, stacked_vision_inputs, takes_images
from hybridrl.modeling.positions import position_ids_from_mask
from hybridrl.modeling.routing_replay import ROUTING_KEYWORD
from hybridrl.modeling.scored_head import runs_head_on_scored_positions, scored_head_log_probs
from hybridrl.modeling.shared_prompts import (TrimmedRows, attention_takes_custom_mask, grouped_call, grouping_pays,
                                             prompt_groups, trim_padding)


@dataclass(frozen=True)
class ResponseTokens:
    """Where the valid response tokens of a micro-batch are, and where their scoring outputs come from.

    Attributes:
        valid: ``[B, R]`` bool — response positions holding a real token (``attention_mask[:, P:]``).
        targets: ``[M]`` the token ids at those positions, row-major order.
    """

    valid: torch.Tensor
    targets: torch.Tensor

    def scatter(self, values: torch.Tensor) -> torch.Tensor:
        """``[M, ...]`` values at valid response positions → ``[B, R, ...]``, zeros elsewhere (autograd-safe)."""
        out = values.new_zeros((*self.valid.shape, *values.shape[1:]))
        out[self.valid] = values
        return out


def response_tokens(input_ids: torch.Tensor, attention_mask: torch.Tensor, response_length: int) -> ResponseTokens:
    """Locate the valid response tokens of ``[B, T]`` sequences whose last ``response_length`` columns are responses."""
    valid = attention_mask[:, -response_length:].bool()
    return ResponseTokens(valid=valid, targets=input_ids[:, -response_length:][valid])


@dataclass(frozen=True)
class HeadCall:
    """One model forward whose head outputs, selected, are the outputs at the source positions of the valid response
    tokens.

    Attributes:
        inputs: the model's keyword arguments (``input_ids``, ``position_ids``, masks, ``logits_to_keep``, …).
        select: head outputs ``[B', K, ...]`` → ``[M, ...]`` in row-major order of the response positions; it only
            indexes the leading dimensions, so it applies to the head's input (hidden states) as well.
    """

    inputs: dict
    select: Callable[[torch.Tensor], torch.Tensor]


def head_call(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, response_length: int, *,
              packed: bool, share_prompts: bool = False, routed_experts: Optional[torch.Tensor] = None,
              multi_modal: Optional[Sequence[Optional[dict]]] = None) -> HeadCall:
    """The forward that scores ``[B, T]`` rows whose last ``response_length`` columns are responses, in the chosen
    layout (module docstring).

    ``share_prompts``: rows with the same prompt run as one row over a single copy of it when that costs fewer FLOPs
    and the attention takes custom masks (``hybridrl.modeling.shared_prompts``); the outputs are the same.
    ``routed_experts``: ``[B, T, routers, k]`` experts to route each token to (MoE routing replay,
    :mod:`hybridrl.modeling.routing_replay`), laid out as the forward lays out the tokens; prompts are then not shared.
    ``multi_modal``: the rows' image inputs (``Fields.MULTI_MODAL_INPUTS``, :mod:`hybridrl.modeling.multimodal`):
    the forward gets them and the mRoPE positions of its layout; prompts are then not shared.
    """
    response_length = int(response_length)
    vision = stacked_vision_inputs(multi_modal)
    if packed:
        call = _packed_call(model, input_ids, attention_mask, response_length)
        if takes_images(model):  # text rows too: the model builds its per-sequence mask from the text positions
            call = HeadCall({**call.inputs, **packed_vision_call(model, input_ids, attention_mask, vision,
                                                                 response_length)}, call.select)
        return _with_routing(call, routed_experts, lambda experts: experts[attention_mask.bool()].unsqueeze(0))
    trimmed = trim_padding(input_ids, attention_mask, response_length)
    if trimmed.response_width == 0:  # no response token to score: nothing to trim to
        trimmed = TrimmedRows(input_ids, attention_mask, input_ids.shape[1] - response_length, response_length)
    takes_keep = accepts_logits_to_keep(model)
    if share_prompts and routed_experts is None and vision is None and attention_takes_custom_mask(model):
        groups = prompt_groups(trimmed)
        if grouping_pays(model, trimmed, groups):
            return HeadCall(*grouped_call(model, trimmed, groups, takes_keep))
    call = _padded_call(trimmed, takes_keep)
    if vision is not None:
        call = HeadCall({**call.inputs, **padded_vision_call(model, trimmed.input_ids, trimmed.attention_mask, vision,
                                                             trimmed.response_width)}, call.select)
    start = input_ids.shape[1] - response_length - trimmed.prompt_width
    return _with_routing(call, routed_experts, lambda experts: experts[:, start:start + trimmed.input_ids.shape[1]])


def _with_routing(call: HeadCall, routed_experts: Optional[torch.Tensor],
                  layout: Callable[[torch.Tensor], torch.Tensor]) -> HeadCall:
    """``call`` with ``routed_experts`` (``[B, T, routers, k]``) laid out as its ``input_ids`` by ``layout``."""
    if routed_experts is None:
        return call
    return HeadCall({**call.inputs, ROUTING_KEYWORD: layout(routed_experts)}, call.select)


def source_outputs(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, response_length: int,
                   *, packed: bool, share_prompts: bool = False, routed_experts: Optional[torch.Tensor] = None,
                   multi_modal: Optional[Sequence[Optional[dict]]] = None) -> torch.Tensor:
    """Model outputs (``logits`` for a causal LM, ``logits`` of the value head for a critic) at the source positions of
    the valid response tokens: ``[M, D]`` in row-major order of the response positions (see :func:`head_call`)."""
    call = head_call(model, input_ids, attention_mask, response_length, packed=packed, share_prompts=share_prompts,
                     routed_experts=routed_experts, multi_modal=multi_modal)
    return call.select(model(**call.inputs).logits)


def _padded_call(trimmed: TrimmedRows, takes_logits_to_keep: bool) -> HeadCall:
    width = trimmed.response_width
    valid = trimmed.attention_mask[:, trimmed.prompt_width:].bool()
    inputs = dict(input_ids=trimmed.input_ids, attention_mask=trimmed.attention_mask,
                  position_ids=position_ids_from_mask(trimmed.attention_mask), use_cache=False)
    if not takes_logits_to_keep:
        return HeadCall(inputs, lambda outputs: outputs[:, -width - 1:-1][valid])
    # Only the R positions before the last can be sources: a causal LM runs its head on those alone.
    return HeadCall({**inputs, "logits_to_keep": last_positions(trimmed.input_ids.shape[1], width, before_last=True)},
                    lambda outputs: outputs[valid])


def last_positions(length: int, count: int, *, before_last: bool = False, device=None) -> torch.Tensor:
    """``logits_to_keep`` for the last ``count`` positions of rows of ``length`` (ending one early with
    ``before_last``), as an index tensor. Never an int: transformers slices ``hidden[:, -k:, :]`` for an int, and a
    batched slice of a longer row is not contiguous, so ``F.linear`` cannot fold it into one matmul and multiplies
    against the LM head's weight expanded to ``[rows, D, V]`` — a copy of the weight per row (8 rows × 49,152 × 576:
    574 ms instead of 7.9 ms on a 2-core CPU). Indexing makes the ``[rows, count, D]`` copy instead."""
    end = length - 1 if before_last else length
    return torch.arange(end - count, end, device=device)


def _packed_call(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                 response_length: int) -> HeadCall:
    real = attention_mask.bool()
    # Index of each real token in the packed row; the source of response column k is the token before it.
    flat_index = real.flatten().long().cumsum(0).view_as(input_ids) - 1
    source_columns = flat_index[:, -response_length - 1:-1]
    valid = attention_mask[:, -response_length:].bool()
    if not bool(real[:, -response_length - 1:-1][valid].all()):
        raise ValueError("packed forward needs contiguous sequences: every valid response token must follow a real token")
    sources = source_columns[valid]
    # use_cache=False matters: transformers only detects packed sequences when no KV cache is passed.
    inputs = dict(input_ids=input_ids[real].unsqueeze(0),
                  position_ids=position_ids_from_mask(attention_mask)[real].unsqueeze(0), use_cache=False)
    if accepts_logits_to_keep(model):  # the head runs on the M source positions only, in their order
        return HeadCall({**inputs, "logits_to_keep": sources}, lambda outputs: outputs[0])
    return HeadCall(inputs, lambda outputs: outputs[0][sources])


def accepts_logits_to_keep(model: nn.Module) -> bool:
    """Whether ``model`` (a PEFT wrapper is looked through) takes transformers' ``logits_to_keep`` (an int: the last
    positions; a 1-D tensor: those positions) — causal LMs do, so the LM head and the ``[*, vocab]`` logits cover only
    the positions asked for (on prompts of P tokens and responses of R, a head of V × D costs R/(P + R) of a
    full pass). Value and score heads do not, and get the full pass."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return _forward_takes_logits_to_keep(type(base))


@functools.lru_cache(maxsize=None)
def _forward_takes_logits_to_keep(model_class: type) -> bool:
    return "logits_to_keep" in inspect.signature(model_class.forward).parameters


def response_log_probs(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, response_length: int,
                       *, temperature: float = 1.0, packed: bool = False, share_prompts: bool = False,
                       with_entropy: bool = False, entropy_grad: bool = False, fused_head: bool = False,
                       head_on_scored: Optional[bool] = None, routed_experts: Optional[torch.Tensor] = None,
                       multi_modal: Optional[Sequence[Optional[dict]]] = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probs (nats) of the response tokens under ``model``, and optionally the policy entropy.

    Logits are divided by ``temperature`` first, so the numbers match the distribution the rollout sampled from.
    The LM head runs on the scored positions alone (``hybridrl.modeling.scored_head``): ``fused_head`` fused with
    the log-softmax chunk by chunk, so no ``[tokens, vocab]`` logits are kept; otherwise, where the model allows it
    (``head_on_scored=None``: :func:`runs_head_on_scored_positions`), as a plain matmul on the selected hidden states.
    ``head_on_scored=False`` keeps the reference path: the head on every position ``logits_to_keep`` names, then the
    selection. All give the same numbers within rounding. ``routed_experts``, ``multi_modal``: see :func:`head_call`.

    Returns:
        ``(log_probs [B, R], entropy [B, R] or None)``, zero at invalid positions. The entropy keeps its graph only
        when ``entropy_grad`` (an entropy bonus is in the loss); otherwise it is computed without gradients.
    """
    tokens = response_tokens(input_ids, attention_mask, response_length)
    call = head_call(model, input_ids, attention_mask, response_length, packed=packed, share_prompts=share_prompts,
                     routed_experts=routed_experts, multi_modal=multi_modal)
    if head_on_scored is None:
        head_on_scored = runs_head_on_scored_positions(model)
    if fused_head or head_on_scored:
        log_probs, entropy = scored_head_log_probs(model, call.inputs, call.select, tokens.targets,
                                                   temperature=temperature, with_entropy=with_entropy,
                                                   entropy_grad=entropy_grad and torch.is_grad_enabled(),
                                                   fused=fused_head)
        return tokens.scatter(log_probs), (tokens.scatter(entropy) if with_entropy else None)
    logits = call.select(model(**call.inputs).logits)
    if temperature != 1.0:
        logits = logits / temperature
    log_probs, entropy = token_log_probs_and_entropy(logits, tokens.targets, with_entropy=with_entropy,
                                                     entropy_grad=entropy_grad)
    return tokens.scatter(log_probs), (tokens.scatter(entropy) if with_entropy else None)


def response_values(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, response_length: int,
                    *, packed: bool = False, share_prompts: bool = False) -> torch.Tensor:
    """Critic values ``[B, R]`` of the state before each response token (zero at invalid positions)."""
    tokens = response_tokens(input_ids, attention_mask, response_length)
    values = source_outputs(model, input_ids, attention_mask, response_length, packed=packed,
                            share_prompts=share_prompts)
    return tokens.scatter(values.squeeze(-1).float())


def pooled_scores(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """``[B]`` scores of a sequence classifier that pools its own input (an encoder reward model: DeBERTa-v2/v3 reads
    its first token), each row's real tokens moved to the front (right padding) so the pooled position is real."""
    real = attention_mask.bool()
    order = torch.argsort((~real).to(torch.int8), dim=1, stable=True)  # real tokens first, in their order
    ids, mask = input_ids.gather(1, order), attention_mask.gather(1, order)
    return model(input_ids=ids, attention_mask=mask).logits.squeeze(-1).float()


def sequence_scores(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, *,
                    packed: bool = False) -> torch.Tensor:
    """``[B]`` scores of a one-label sequence classifier at each row's last real token (rows left/right padded).

    The per-token head outputs are captured with a forward hook on ``model.score`` during the root forward (FSDP2
    only gathers the head's parameters inside that forward), then read at the last position of ``attention_mask``.
    ``packed``: the real tokens of all rows go through as one ``[1, N]`` row with per-sequence position ids (a
    block-diagonal causal mask: no attention across rows, no FLOPs on pads); the scores equal the padded forward's.
    Gradients flow through the scores when grad mode is on (reward-model training). A classifier without a
    per-token ``score`` head pools for itself (:func:`pooled_scores`).
    """
    if not hasattr(model, "score"):  # a classifier with its own pooling, e.g. DeBERTa's over its first token
        return pooled_scores(model, input_ids, attention_mask)
    captured: list[torch.Tensor] = []
    handle = model.score.register_forward_hook(lambda module, inputs, output: captured.append(output))
    positions = position_ids_from_mask(attention_mask)
    real = attention_mask.bool()
    try:
        if packed:  # use_cache=False: transformers only detects packed sequences without a KV cache
            output = model(input_ids=input_ids[real][None], position_ids=positions[real][None], use_cache=False)
        else:
            output = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions,
                           use_cache=False)
    finally:
        handle.remove()
    per_token = captured[0].squeeze(-1).float()
    if packed:
        scores = per_token[0, real.sum(dim=-1).cumsum(dim=0) - 1]
    else:
        columns = torch.arange(attention_mask.shape[1], device=attention_mask.device)
        scores = per_token[torch.arange(len(per_token)), (real * columns).argmax(dim=-1)]
    # FSDP2 unshards the root's parameters (embeddings, final norm, head) for backward in a hook on the root forward's
    # *outputs*; scores read from a hooked intermediate would bypass it. A zero-weighted term keeps the output in the
    # graph (exactly +0 to every score) so that hook fires.
    return scores + 0.0 * output.logits.float().sum()
