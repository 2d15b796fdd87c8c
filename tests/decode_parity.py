"""The fast decode step and the module's forward side by side over the same decode steps (CPU and GPU tests)."""

from __future__ import annotations

import torch
from transformers import DynamicCache

from hybridrl.modeling.decode_step import DecodeStep
from hybridrl.modeling.positions import position_ids_from_mask


@torch.no_grad()
def decode_both_ways(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, steps: int):
    """Prefill ``ids [R, P]`` (``mask``: left padding) through the module, then ``steps`` greedy decode steps through
    both. Returns the ``(fast, module)`` logits ``[R, V]`` of each step and both final caches (per layer
    ``[keys, values]``); both sides are fed the module's greedy tokens."""
    out = model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask),
                past_key_values=DynamicCache(config=model.config), use_cache=True)
    reference = out.past_key_values
    cache = [[keys.clone(), values.clone()] for keys, values in DecodeStep.cache_from(reference)]
    step = DecodeStep(model)
    token, positions = out.logits[:, -1].argmax(-1, keepdim=True), position_ids_from_mask(mask)[:, -1:] + 1
    pairs = []
    for _ in range(steps):
        mask = torch.cat([mask, torch.ones_like(token)], dim=1)
        expected = model(input_ids=token, attention_mask=mask, position_ids=positions,
                         past_key_values=reference, use_cache=True).logits[:, -1]
        pairs.append((step(token, positions, mask, cache), expected))
        token, positions = expected.argmax(-1, keepdim=True), positions + 1
    return pairs, cache, DecodeStep.cache_from(reference)
