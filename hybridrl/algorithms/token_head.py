"""Token log-probs and entropies straight from hidden states: the LM head fused with the log-softmax.

The plain path runs the LM head on every scored position, ``[M, D] @ [D, V] → [M, V]`` logits, then takes the
log-softmax (:mod:`hybridrl.algorithms.logits`). Autograd then keeps the logits in the compute dtype, the fp32 copy
mixed precision makes of them, and in backward an fp32 and a compute-dtype gradient of the same size: with a 150k
vocabulary and 8k scored tokens that is ≈ 12 GB. Here the head's matmul runs ``chunk`` tokens at a time inside one
autograd function that keeps only the hidden states, the head weight (references, not copies) and two floats per
token; backward recomputes each chunk's logits. Peak extra memory is one chunk's ``[chunk, V]`` working set plus,
with several chunks, an fp32 accumulator for the weight's gradient (``[V, D]``), whatever ``M`` is. The price is the
head's forward matmul a second time in backward (``2·M·D·V`` FLOPs, a third of the head's training FLOPs) — on the
CPU more than repaid by the element-wise passes over ``[M, V]`` it saves (``benchmarks/lm_head.py``).

Numerics follow the plain path: the matmul in the hidden states' dtype, its output cast to fp32 (fp64 for fp64
inputs), divided by the temperature, then an exact log-softmax; gradients enter the matmul's backward in the
compute dtype, as they do after a mixed-precision output cast; the log-softmax is the plain path's own
(``logits._log_softmax_chunk``). What differs is rounding in backward: the two gradient terms summed in one chunk, and
the weight gradient summed chunk by chunk in fp32 (tests: within 1e-5 of the plain path in fp32).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch.autograd.function import once_differentiable

from hybridrl.algorithms.logits import _log_softmax_chunk  # the plain path's log-softmax: the same rounding

__all__ = ["DEFAULT_HEAD_CHUNK_BYTES", "head_chunk_tokens", "token_log_probs_from_hidden"]

DEFAULT_HEAD_CHUNK_BYTES = 256 << 20
"""Bytes of one chunk's fp32 logits: 256 MiB is ≈ 440 tokens at a 152k vocabulary, 1365 at 49k."""


def head_chunk_tokens(vocab_size: int, chunk_bytes: int = DEFAULT_HEAD_CHUNK_BYTES) -> int:
    """Tokens per chunk so that one chunk's fp32 ``[chunk, vocab]`` logits take at most ``chunk_bytes`` (≥ 1)."""
    if vocab_size < 1 or chunk_bytes < 1:
        raise ValueError(f"vocab_size and chunk_bytes must be >= 1, got {vocab_size}, {chunk_bytes}")
    return max(1, chunk_bytes // (4 * vocab_size))


def _chunk_logits(hidden: torch.Tensor, weight: torch.Tensor, temperature: float, dtype: torch.dtype) -> torch.Tensor:
    """``[C, V]`` logits of a ``[C, D]`` hidden chunk in ``dtype``: the head matmul in the inputs' dtype, then cast."""
    logits = torch.nn.functional.linear(hidden, weight).to(dtype)
    return logits.div_(temperature) if temperature != 1.0 else logits


class _HeadLogProbs(torch.autograd.Function):
    """``(log p(target), H)`` per token from ``hidden @ weight.T / T``; backward recomputes each chunk."""

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, temperature: float,
                chunk: int, with_entropy: bool):
        dtype = torch.float64 if hidden.dtype == torch.float64 else torch.float32
        num_tokens = hidden.shape[0]
        log_probs = torch.empty(num_tokens, dtype=dtype, device=hidden.device)
        entropy = torch.zeros(num_tokens, dtype=dtype, device=hidden.device)
        for start in range(0, num_tokens, chunk):
            rows = slice(start, min(start + chunk, num_tokens))
            log_p = _log_softmax_chunk(_chunk_logits(hidden[rows], weight, temperature, dtype))[0]
            log_probs[rows] = log_p.gather(-1, targets[rows, None]).squeeze(-1)
            if with_entropy:
                entropy[rows] = -(log_p.exp() * log_p).sum(dim=-1)
        ctx.save_for_backward(hidden, weight, targets, entropy)
        ctx.temperature, ctx.chunk = temperature, chunk
        ctx.mark_non_differentiable(*(() if with_entropy else (entropy,)))
        return log_probs, entropy

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_log_probs: Optional[torch.Tensor], grad_entropy: Optional[torch.Tensor]):
        hidden, weight, targets, entropy = ctx.saved_tensors
        dtype = entropy.dtype
        needs_hidden, needs_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_hidden = torch.empty_like(hidden) if needs_hidden else None
        starts = range(0, hidden.shape[0], ctx.chunk)
        # Several chunks sum their weight gradients in fp32 (a [V, D] accumulator); one chunk needs none.
        grad_weight = torch.zeros(weight.shape, dtype=dtype, device=weight.device) \
            if needs_weight and len(starts) > 1 else None
        for start in starts:
            rows = slice(start, min(start + ctx.chunk, hidden.shape[0]))
            log_p = _log_softmax_chunk(_chunk_logits(hidden[rows], weight, ctx.temperature, dtype))[0]
            grad_logits = _chunk_logits_grad(log_p, targets[rows], entropy[rows], grad_log_probs, grad_entropy, rows)
            grad_logits = grad_logits.div_(ctx.temperature).to(hidden.dtype)  # d(x/T)/dx, then the compute dtype
            if needs_hidden:
                grad_hidden[rows] = grad_logits @ weight
            if needs_weight and grad_weight is None:
                grad_weight = grad_logits.T @ hidden[rows]
            elif needs_weight:
                grad_weight += (grad_logits.T @ hidden[rows]).to(dtype)
        return grad_hidden, None if grad_weight is None else grad_weight.to(weight.dtype), None, None, None, None


def _chunk_logits_grad(log_p: torch.Tensor, targets: torch.Tensor, entropy: torch.Tensor,
                       grad_log_probs: Optional[torch.Tensor], grad_entropy: Optional[torch.Tensor],
                       rows: slice) -> torch.Tensor:
    """``d(loss)/d(logits / T)`` of a chunk, ``[C, V]``, consuming ``log_p``: ``g_lp (onehot − p)`` from the
    log-probs plus ``−g_H p (log p + H)`` from the entropy (``dH/dz_v = −p_v (log p_v + H)``)."""
    probs = log_p.exp()
    if grad_log_probs is not None:
        grad_lp = grad_log_probs[rows].to(log_p.dtype).unsqueeze(-1)
        grad = (probs * -grad_lp).scatter_add_(-1, targets.unsqueeze(-1), grad_lp)
    else:
        grad = torch.zeros_like(log_p)
    if grad_entropy is not None:
        grad_h = grad_entropy[rows].to(log_p.dtype).unsqueeze(-1)
        grad.sub_(log_p.add_(entropy.unsqueeze(-1)).mul_(probs).mul_(grad_h))
    return grad


def token_log_probs_from_hidden(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, *,
                                temperature: float = 1.0, chunk: Optional[int] = None,
                                with_entropy: bool = False) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Log-prob (nats) of each target, and optionally the entropy, under ``softmax(hidden @ weight.T / temperature)``
    — without materialising the ``[M, V]`` logits.

    Args:
        hidden: ``[M, D]`` final hidden states at the scoring positions (after the last norm), compute dtype.
        weight: ``[V, D]`` the LM head's weight, same dtype as ``hidden`` (a bias-free head, as causal LMs have).
        targets: ``[M]`` token ids in ``[0, V)``.
        temperature: the sampling temperature the logits are divided by.
        chunk: tokens per chunk; ``None``: :func:`head_chunk_tokens` of ``V``.
        with_entropy: also return the entropy (differentiable: an entropy bonus may be in the loss).

    Returns:
        ``(log_probs [M], entropy [M] or None)`` in fp32 (fp64 for fp64 inputs), differentiable w.r.t. ``hidden``
        and ``weight``.
    """
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(f"hidden [M, D] and weight [V, D] expected, got {tuple(hidden.shape)} and "
                         f"{tuple(weight.shape)}")
    if tuple(targets.shape) != (hidden.shape[0],):
        raise ValueError(f"targets must be [M] = [{hidden.shape[0]}], got {tuple(targets.shape)}")
    if hidden.dtype != weight.dtype:
        raise ValueError(f"hidden ({hidden.dtype}) and weight ({weight.dtype}) must share a dtype")
    chunk = head_chunk_tokens(weight.shape[0]) if chunk is None else int(chunk)
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    log_probs, entropy = _HeadLogProbs.apply(hidden, weight, targets.long(), float(temperature), chunk, with_entropy)
    return log_probs, entropy if with_entropy else None
