"""Shared-prompt rows: the ``n`` responses to one prompt run as one row over a single copy of the prompt.

GRPO-style batches repeat every prompt ``n`` times (``rollout.n``). A padded forward recomputes the prompt for each
copy; here a micro-batch's rows with the same prompt become one *group row*::

    [prompt (P', left-padded) | response slot 1 (R') | response slot 2 (R') | ... | slot S (R')]

with each slot holding one response at its original position ids (``prompt length + k``) and a mask that lets a
slot's tokens see the prompt and the earlier tokens of their own slot only. Every real token therefore sees exactly
the keys it sees in its own padded row, at the same positions: outputs and gradients equal the padded computation
(the prompt's activations receive the sum of the slots' gradients, as the ``n`` copies' would be summed). Slot ``s``'s
first response token is scored by the last prompt token, shared by all slots; the others by the slot's own previous
column.

Columns that are padding in every row of the micro-batch (left of the longest prompt, right of the longest response)
are dropped first, in both layouts. The grouped layout is used when its estimated FLOPs (linear layers per token plus
the dense attention score matrices) are lower than the padded rows', and the model's attention takes a custom 4-D
mask (eager, sdpa and the CPU kernel do; flash-attn 2 and flex attention do not).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

from hybridrl.modeling.positions import position_ids_from_mask
from hybridrl.modeling.ulysses import sequence_parallel_of
from hybridrl.protocol import Batch, Fields

MASKED_ATTENTION = ("eager", "sdpa", "hybridrl_cpu")
"""Attention implementations that take a custom ``[B, 1, q, k]`` mask as given (boolean; eager: additive float)."""
MAX_SCORE_GROWTH = 2
"""Group rows may hold at most this many times the attention score entries of the padded rows they replace."""


@dataclass(frozen=True)
class TrimmedRows:
    """A padded ``[B, T]`` micro-batch without its all-padding columns: ``prompt_width`` (P') prompt columns and
    ``response_width`` (R') response columns kept (``P - P'`` dropped on the left, ``R - R'`` on the right)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    prompt_width: int
    response_width: int


def trim_padding(input_ids: torch.Tensor, attention_mask: torch.Tensor, response_length: int) -> TrimmedRows:
    """Drop the columns that are padding in every row: the left of the prompt block and the right of the responses.

    Exact: dropped left columns are masked keys for every query, and dropped right columns come after every real
    token, so a causal model never lets a real token see them. Position ids must be derived after trimming from
    the mask (they count real tokens only, so they are unchanged).
    """
    prompt_length = input_ids.shape[1] - response_length
    real_columns = attention_mask.bool().any(dim=0)
    prompt_real = torch.nonzero(real_columns[:prompt_length])
    response_real = torch.nonzero(real_columns[prompt_length:])
    # At least one prompt column: response token 0 is scored from the column before it, even if that is padding.
    prompt_width = max(prompt_length - int(prompt_real[0]) if len(prompt_real) else 0, min(prompt_length, 1))
    response_width = int(response_real[-1]) + 1 if len(response_real) else 0
    columns = slice(prompt_length - prompt_width, prompt_length + response_width)
    return TrimmedRows(input_ids[:, columns], attention_mask[:, columns], prompt_width, response_width)


@dataclass(frozen=True)
class GroupRows:
    """A micro-batch rearranged into group rows (module docstring). Shapes: ``G`` groups, ``W = P' + S·R'`` columns,
    ``K = 1 + S·(R' − 1)`` scored columns, ``M`` valid response tokens.

    Attributes:
        input_ids, position_ids: ``[G, W]``.
        attention_mask: ``[G, 1, W, W]`` bool, True = may attend (pad queries see themselves only, so no row of it
            is empty).
        head_columns: ``[K]`` the columns whose outputs score response tokens (``logits_to_keep``).
        token_group, token_head: ``[M]`` for each valid response token in row-major ``[B, R]`` order: its group row
            and its index into ``head_columns``.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    attention_mask: torch.Tensor
    head_columns: torch.Tensor
    token_group: torch.Tensor
    token_head: torch.Tensor


def prompt_groups(trimmed: TrimmedRows) -> list[list[int]]:
    """Row indices of each distinct prompt (token ids and mask of the prompt block), in order of first appearance."""
    prompt_ids = trimmed.input_ids[:, :trimmed.prompt_width] * trimmed.attention_mask[:, :trimmed.prompt_width]
    prompt_mask = trimmed.attention_mask[:, :trimmed.prompt_width].bool()
    groups: dict[tuple, list[int]] = {}
    for row, (ids, mask) in enumerate(zip(prompt_ids.tolist(), prompt_mask.tolist())):
        groups.setdefault((tuple(ids), tuple(mask)), []).append(row)
    return list(groups.values())


def group_rows(trimmed: TrimmedRows, groups: list[list[int]]) -> GroupRows:
    """Lay ``trimmed``'s rows out as one row per group of equal prompts (``groups`` from :func:`prompt_groups`)."""
    prompt_width, width = trimmed.prompt_width, trimmed.response_width
    slots = max(len(group) for group in groups)
    columns = prompt_width + slots * width
    mask = trimmed.attention_mask.long()
    positions = position_ids_from_mask(mask)
    num_groups, device = len(groups), trimmed.input_ids.device
    ids = trimmed.input_ids.new_zeros((num_groups, columns))
    grouped_positions = positions.new_zeros((num_groups, columns))
    real = torch.zeros((num_groups, columns), dtype=torch.bool, device=device)
    for g, rows in enumerate(groups):
        ids[g, :prompt_width] = trimmed.input_ids[rows[0], :prompt_width]
        grouped_positions[g, :prompt_width] = positions[rows[0], :prompt_width]
        real[g, :prompt_width] = mask[rows[0], :prompt_width].bool()
        for slot, row in enumerate(rows):
            span = slice(prompt_width + slot * width, prompt_width + (slot + 1) * width)
            ids[g, span] = trimmed.input_ids[row, prompt_width:]
            grouped_positions[g, span] = positions[row, prompt_width:]
            real[g, span] = mask[row, prompt_width:].bool()
    head_columns = torch.tensor([prompt_width - 1] + [prompt_width + slot * width + k - 1
                                                      for slot in range(slots) for k in range(1, width)],
                                device=device)
    token_group, token_head = _token_sources(trimmed, groups, width)
    return GroupRows(ids, grouped_positions, _group_mask(real, prompt_width, width, slots), head_columns,
                     token_group, token_head)


def _group_mask(real: torch.Tensor, prompt_width: int, width: int, slots: int) -> torch.Tensor:
    """``[G, 1, W, W]``: key real, not after the query, and in the prompt or the query's own slot; plus the diagonal."""
    columns, device = real.shape[1], real.device
    segment = torch.cat([torch.zeros(prompt_width, dtype=torch.long, device=device),
                         torch.arange(1, slots + 1, device=device).repeat_interleave(width)])
    index = torch.arange(columns, device=device)
    visible = (index[None, :] <= index[:, None]) & ((segment[None, :] == 0) | (segment[None, :] == segment[:, None]))
    visible = visible.unsqueeze(0) & real[:, None, :]
    return (visible | torch.eye(columns, dtype=torch.bool, device=device)).unsqueeze(1)


def _token_sources(trimmed: TrimmedRows, groups: list[list[int]], width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Group row and ``head_columns`` index of every valid response token, in row-major ``[B, R']`` order."""
    rows, device = trimmed.input_ids.shape[0], trimmed.input_ids.device
    group_of_row, slot_of_row = [0] * rows, [0] * rows
    for g, members in enumerate(groups):
        for slot, row in enumerate(members):
            group_of_row[row], slot_of_row[row] = g, slot
    group_of_row = torch.tensor(group_of_row, device=device)
    slot_of_row = torch.tensor(slot_of_row, device=device)
    k = torch.arange(width, device=device)
    head = torch.where(k == 0, 0, 1 + slot_of_row[:, None] * (width - 1) + (k - 1))  # [B, R']
    valid = trimmed.attention_mask[:, trimmed.prompt_width:].bool()
    return group_of_row[:, None].expand(rows, width)[valid], head[valid]


def prompts_together(batch: Batch) -> Batch:
    """``batch`` with the rows of each prompt next to each other — prompts in order of first appearance, rows in
    order within a prompt — so that fixed-size micro-batches cut from it hold whole groups (after a shuffle of the
    sequences they would hold scattered ones). Which rows form the batch is unchanged, so the gradient is too."""
    prompt_length = batch[Fields.INPUT_IDS].shape[1] - batch[Fields.RESPONSES].shape[-1]
    mask = batch[Fields.ATTENTION_MASK][:, :prompt_length].long()
    prompts = torch.cat([batch[Fields.INPUT_IDS][:, :prompt_length] * mask, mask], dim=1)
    _, prompt_index = torch.unique(prompts, dim=0, return_inverse=True)
    rows = torch.arange(len(batch), device=prompt_index.device)
    first_row = torch.full((int(prompt_index.max()) + 1,), len(batch), device=rows.device).scatter_reduce(
        0, prompt_index, rows, "amin")
    return batch.reorder(torch.argsort(first_row[prompt_index] * len(batch) + rows))


def attention_takes_custom_mask(model: nn.Module) -> bool:
    """Whether ``model``'s attention implementation honours a custom 4-D boolean mask (:data:`MASKED_ATTENTION`).
    Never under sequence parallelism, which splits ``[B, L]`` rows (:mod:`hybridrl.modeling.ulysses`)."""
    if sequence_parallel_of(model) is not None:
        return False
    config = getattr(model, "config", None)
    return getattr(config, "_attn_implementation", None) in MASKED_ATTENTION


def grouping_pays(model: nn.Module, trimmed: TrimmedRows, groups: list[list[int]]) -> bool:
    """Whether group rows cost fewer estimated FLOPs than padded rows — per layer, every token through the linear
    layers (``4·d² + 3·d·f``, Llama-like) plus every query-key pair of the dense score matrices (``4·d``) — while
    holding at most :data:`MAX_SCORE_GROWTH` times the padded rows' attention scores (the memory the micro-batch
    sizing planned for is that of padded rows)."""
    rows = trimmed.input_ids.shape[0]
    if len(groups) == rows or trimmed.prompt_width == 0 or trimmed.response_width == 0:
        return False
    config = getattr(model, "config", None)
    hidden = getattr(config, "hidden_size", None) or 1024
    ffn = getattr(config, "intermediate_size", None) or 4 * hidden
    per_token, per_pair = 4 * hidden * hidden + 3 * hidden * ffn, 4 * hidden
    slots = max(len(group) for group in groups)
    padded_width = trimmed.prompt_width + trimmed.response_width
    grouped_width = trimmed.prompt_width + slots * trimmed.response_width
    padded_pairs, grouped_pairs = rows * padded_width ** 2, len(groups) * grouped_width ** 2
    padded_cost = rows * padded_width * per_token + padded_pairs * per_pair
    grouped_cost = len(groups) * grouped_width * per_token + grouped_pairs * per_pair
    return grouped_cost < padded_cost and grouped_pairs <= MAX_SCORE_GROWTH * padded_pairs


def grouped_call(model: nn.Module, trimmed: TrimmedRows, groups: list[list[int]], takes_logits_to_keep: bool):
    """The forward over group rows whose selected head outputs are the outputs at the source positions of the valid
    response tokens, ``[M, D]`` in row-major order of the response positions (as the padded layout gives them): a
    ``hybridrl.modeling.sequences.HeadCall``'s fields, ``(model inputs, select)``."""
    layout = group_rows(trimmed, groups)
    mask = layout.attention_mask
    if model.config._attn_implementation == "eager":  # eager attention adds its mask to the scores
        mask = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device).masked_fill_(
            ~mask, torch.finfo(torch.float32).min)
    keep: dict[str, Optional[torch.Tensor]] = {"logits_to_keep": layout.head_columns} if takes_logits_to_keep else {}
    inputs = dict(input_ids=layout.input_ids, attention_mask=mask, position_ids=layout.position_ids, use_cache=False,
                  **keep)
    columns = layout.token_head if takes_logits_to_keep else layout.head_columns[layout.token_head]
    return inputs, lambda outputs: outputs[layout.token_group, columns]
