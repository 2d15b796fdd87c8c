"""Next-token sampling for the HF engine's decode loop: temperature, top-k, top-p, and one draw per row.

The draw inverts each row's cumulative distribution at one uniform number (a ``cumsum`` and a ``searchsorted``).
``torch.multinomial`` — what transformers' ``generate`` calls — draws one exponential variate per vocabulary entry
instead: on a 2-core AMD EPYC, 32 rows × 49,152 (SmolLM2) take 39.5 ms that way and 0.95 ms this way, and at one draw
per decode step that was 10 % of a SmolLM2 GRPO step. Both sample exactly ``softmax(filtered logits)``; a token the
filters removed (probability 0) can never be drawn.
"""

from __future__ import annotations

from typing import Optional

import torch


def filter_top_k_top_p(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """``logits [R, V]`` with every token outside the row's top ``top_k`` (``≤ 0``: no limit), and then outside its
    nucleus, set to ``-inf``. The nucleus is the smallest set of most probable tokens whose probability reaches
    ``top_p`` (``1.0``: no limit): a token stays if the tokens ranked above it sum to less than ``top_p``, so the
    most probable token always stays. Ties are broken by the sort, as in vLLM and transformers."""
    vocab = logits.shape[-1]
    if 0 < top_k < vocab:
        kth = logits.topk(top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        mass_above = probs.cumsum(dim=-1) - probs
        sorted_logits = sorted_logits.masked_fill(mass_above >= top_p, float("-inf"))
        logits = torch.empty_like(logits).scatter_(-1, order, sorted_logits)
    return logits


def sample_rows(probs: torch.Tensor, uniforms: Optional[torch.Tensor] = None) -> torch.Tensor:
    """One token id per row of ``probs [R, V]`` (non-negative, each row summing to ≈ 1) → ``[R]``. Inverse-CDF: the
    first token whose cumulative probability exceeds ``u · total``, with ``u`` from ``uniforms [R, 1]`` (in
    ``[0, 1)``, the dtype of ``probs``) or drawn here with torch's global generator."""
    cdf = probs.cumsum(dim=-1)
    total = cdf[:, -1:]
    if uniforms is None:
        uniforms = torch.rand(total.shape, dtype=cdf.dtype, device=cdf.device)
    target = uniforms * total
    # strictly below the total, so the search never runs past the last token with probability > 0
    target = torch.minimum(target, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, target, right=True).squeeze(-1)


def next_tokens(scaled_logits: torch.Tensor, *, do_sample: bool, top_k: int, top_p: float,
                uniforms: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The next token of each row from its last position's ``scaled_logits [R, V]`` (fp32, already divided by the
    temperature): greedy (``argmax``) or a sample of ``softmax(filter(scaled_logits))`` → ``[R]``, drawn at
    ``uniforms [R, 1]`` when given (see :func:`sample_rows`)."""
    if not do_sample:
        return scaled_logits.argmax(dim=-1)
    return sample_rows(filter_top_k_top_p(scaled_logits, top_k, top_p).softmax(dim=-1), uniforms)
