"""The rollout layout of a :class:`~hybridrl.protocol.Batch`: what every generation engine returns and every
training stage reads (the fields are listed in :mod:`hybridrl.rollout.base`). SFT examples are encoded in the same
layout (:mod:`hybridrl.data.sft`), so supervised and RL losses run through one engine."""

from __future__ import annotations

from typing import Iterable

import torch

from hybridrl.protocol.batch import Batch
from hybridrl.protocol.fields import Fields


def response_mask_from_eos(responses: torch.Tensor, eos_token_ids: Iterable[int]) -> torch.Tensor:
    """``[B, R]`` mask: 1 up to and including the first EOS of each row, 0 after it (all 1 if there is no EOS)."""
    is_eos = torch.zeros_like(responses, dtype=torch.bool)
    for eos in eos_token_ids:
        is_eos |= responses == eos
    eos_before = is_eos.long().cumsum(dim=-1) - is_eos.long()  # EOS tokens strictly before each position
    return (eos_before == 0).long()


def assemble_rollout(prompts: Batch, n: int, responses: torch.Tensor, response_mask: torch.Tensor,
                     rollout_log_probs: torch.Tensor, pad_token_id: int) -> Batch:
    """Build the rollout ``Batch`` (layout in the module docstring) from engine outputs for the repeated prompts."""
    repeated = prompts.repeat_interleave(n)
    prompt_ids, prompt_mask = repeated[Fields.INPUT_IDS], repeated[Fields.ATTENTION_MASK]
    responses = torch.where(response_mask.bool(), responses, torch.full_like(responses, pad_token_id))
    tensors = {
        Fields.PROMPTS: prompt_ids,
        Fields.RESPONSES: responses,
        Fields.RESPONSE_MASK: response_mask,
        Fields.INPUT_IDS: torch.cat([prompt_ids, responses], dim=-1),
        Fields.ATTENTION_MASK: torch.cat([prompt_mask, response_mask], dim=-1),
        Fields.ROLLOUT_LOG_PROBS: rollout_log_probs * response_mask,
    }
    return Batch(tensors=tensors, non_tensors=dict(repeated.non_tensors), meta=prompts.meta)
