"""Memory-aware token log-probs and entropies from logits.

Logits for a whole micro-batch are ``[batch, seq_len, vocab]`` — with a 150k vocabulary that is gigabytes, so
materialising one more tensor of that size (a ``log_softmax``, a ``softmax``, an fp32 copy of bf16 logits) is
what runs a device out of memory. These functions process the flattened token dimension in chunks of
``chunk_size`` tokens and are custom autograd functions that save only the logits themselves (a reference, not a
copy) and small per-token statistics for backward, recomputing each chunk's softmax there. Peak extra memory is
therefore one chunk's fp32 working set, ``chunk_size * vocab`` floats, in forward and in backward (plus, in
backward, the logits gradient itself, which any method must produce).

Computation is in fp32 (fp64 for fp64 logits) whatever the logits dtype; outputs are in that compute dtype and
the logits gradient in the logits dtype.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Optional

import torch
from torch.autograd.function import once_differentiable

__all__ = ["DEFAULT_CHUNK_SIZE", "entropy_from_logits", "log_probs_and_entropy_from_logits", "log_probs_from_logits",
           "token_log_probs_and_entropy"]

DEFAULT_CHUNK_SIZE = 1024  # tokens per chunk; × vocab × 4 bytes is the working set (~600 MB at a 150k vocab)


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _as_rows(logits: torch.Tensor) -> torch.Tensor:
    """A ``[groups, tokens, vocab]`` view of ``logits`` without copying (``[*, vocab]`` in, any layout)."""
    if logits.dim() < 2:
        raise ValueError(f"logits must be [..., vocab], got shape {tuple(logits.shape)}")
    vocab = logits.shape[-1]
    try:
        return logits.view(1, -1, vocab)  # contiguous token dimension: chunks may span rows
    except RuntimeError:
        pass
    if logits.dim() == 2:
        return logits.unsqueeze(0)
    try:
        return logits.view(-1, logits.shape[-2], vocab)  # e.g. logits[:, :-1]: chunk within each row
    except RuntimeError:
        return logits.reshape(-1, logits.shape[-2], vocab)  # exotic layouts (permuted): one copy, still correct


def _chunks(rows: torch.Tensor, chunk_size: int) -> Iterator[tuple[int, slice]]:
    """``(group, token_slice)`` pairs covering a ``[groups, tokens, vocab]`` tensor, ``chunk_size`` tokens each."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    for group in range(rows.shape[0]):
        for start in range(0, rows.shape[1], chunk_size):
            yield group, slice(start, min(start + chunk_size, rows.shape[1]))


def _log_softmax_chunk(chunk: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(log_probs, shift, log_sum)`` of a ``[tokens, vocab]`` chunk, with ``log p = (x - shift) - log_sum``.

    Subtracting the row max first (as ``log_softmax`` does) keeps ``log p`` exact to fp32 even for logits of
    size 1e4, where ``x - logsumexp(x)`` would lose the fractional digits.
    """
    shift = chunk.amax(dim=-1, keepdim=True)
    shifted = chunk - shift
    log_sum = torch.logsumexp(shifted, dim=-1, keepdim=True)
    return shifted.sub_(log_sum), shift.squeeze(-1), log_sum.squeeze(-1)


def _recompute_log_probs(chunk: torch.Tensor, shift: torch.Tensor, log_sum: torch.Tensor) -> torch.Tensor:
    """The chunk's ``log p`` from saved per-token statistics (a fresh tensor; ``chunk`` may alias the logits)."""
    return (chunk - shift.unsqueeze(-1)).sub_(log_sum.unsqueeze(-1))


def _chunk_entropy(log_probs: torch.Tensor) -> torch.Tensor:
    """``-sum_v p_v log p_v`` per token of a ``[tokens, vocab]`` chunk of log-probs."""
    return -(torch.exp(log_probs) * log_probs).sum(dim=-1)


class _TokenLogProbs(torch.autograd.Function):
    """``log p(label)`` chunk by chunk; backward ``grad * (onehot(label) - softmax)``, recomputed per chunk. With
    ``with_entropy`` also each token's entropy from the same log-softmax (one pass over the logits fewer than a
    separate :func:`entropy_from_logits`, the same bits); that output is not differentiable."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, labels: torch.Tensor, chunk_size: int, with_entropy: bool):
        rows = _as_rows(logits)
        label_rows = labels.reshape(rows.shape[:2])
        dtype = _compute_dtype(logits.dtype)
        shifts, log_sums, out = (torch.empty(rows.shape[:2], dtype=dtype, device=logits.device) for _ in range(3))
        entropy = torch.empty(rows.shape[:2] if with_entropy else (0,), dtype=dtype, device=logits.device)
        for group, tokens in _chunks(rows, chunk_size):
            chunk = rows[group, tokens].to(dtype)
            log_probs, shifts[group, tokens], log_sums[group, tokens] = _log_softmax_chunk(chunk)
            out[group, tokens] = log_probs.gather(-1, label_rows[group, tokens].unsqueeze(-1)).squeeze(-1)
            if with_entropy:
                entropy[group, tokens] = _chunk_entropy(log_probs)
        ctx.save_for_backward(logits, label_rows, shifts, log_sums)
        ctx.chunk_size = chunk_size
        entropy = entropy.view(labels.shape) if with_entropy else entropy
        ctx.mark_non_differentiable(entropy)
        return out.view(labels.shape), entropy

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: torch.Tensor, _grad_entropy: torch.Tensor):
        logits, label_rows, shifts, log_sums = ctx.saved_tensors
        rows = _as_rows(logits)
        grad_rows = grad_out.reshape(rows.shape[:2]).to(shifts.dtype)
        grad_logits = torch.empty(rows.shape, dtype=logits.dtype, device=logits.device)
        for group, tokens in _chunks(rows, ctx.chunk_size):
            chunk = rows[group, tokens].to(shifts.dtype)
            probs = _recompute_log_probs(chunk, shifts[group, tokens], log_sums[group, tokens]).exp_()
            grad_chunk = grad_rows[group, tokens].unsqueeze(-1)
            grad = probs.mul_(-grad_chunk).scatter_add_(-1, label_rows[group, tokens].unsqueeze(-1), grad_chunk)
            grad_logits[group, tokens] = grad
        return grad_logits.view(logits.shape), None, None, None


class _Entropy(torch.autograd.Function):
    """``H = -sum_v p_v log p_v``; backward ``dH/dx_v = -p_v (x_v - E_p[x]) = -p_v (log p_v + H)``."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, chunk_size: int) -> torch.Tensor:
        rows = _as_rows(logits)
        dtype = _compute_dtype(logits.dtype)
        shifts, log_sums, entropy = (torch.empty(rows.shape[:2], dtype=dtype, device=logits.device) for _ in range(3))
        for group, tokens in _chunks(rows, chunk_size):
            chunk = rows[group, tokens].to(dtype)
            log_probs, shifts[group, tokens], log_sums[group, tokens] = _log_softmax_chunk(chunk)
            entropy[group, tokens] = _chunk_entropy(log_probs)
        ctx.save_for_backward(logits, shifts, log_sums, entropy)
        ctx.chunk_size = chunk_size
        return entropy.view(logits.shape[:-1])

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: torch.Tensor):
        logits, shifts, log_sums, entropy = ctx.saved_tensors
        rows = _as_rows(logits)
        grad_rows = grad_out.reshape(rows.shape[:2]).to(shifts.dtype)
        grad_logits = torch.empty(rows.shape, dtype=logits.dtype, device=logits.device)
        for group, tokens in _chunks(rows, ctx.chunk_size):
            chunk = rows[group, tokens].to(shifts.dtype)
            log_probs = _recompute_log_probs(chunk, shifts[group, tokens], log_sums[group, tokens])
            probs = torch.exp(log_probs)
            centered = log_probs.add_(entropy[group, tokens].unsqueeze(-1))  # x - E_p[x] = log p + H
            grad_logits[group, tokens] = probs.mul_(centered).mul_(-grad_rows[group, tokens].unsqueeze(-1))
        return grad_logits.view(logits.shape), None


def log_probs_from_logits(
    logits: torch.Tensor, labels: torch.Tensor, chunk_size: int = DEFAULT_CHUNK_SIZE
) -> torch.Tensor:
    """Log-probability (nats) of each label under ``softmax(logits)``, without a full ``log_softmax``.

    Args:
        logits: ``[..., vocab]``, e.g. ``[batch, response_len, vocab]``; any float dtype, any layout.
        labels: ``[...]`` integer token ids in ``[0, vocab)``, matching ``logits.shape[:-1]``.
        chunk_size: tokens processed at a time (bounds the extra memory, see the module docstring).

    Returns:
        ``[...]`` log-probs in fp32 (fp64 for fp64 logits); differentiable w.r.t. ``logits``. Equals
        ``logits.float().log_softmax(-1).gather(-1, labels[..., None])[..., 0]``.
    """
    _check_labels(logits, labels)
    return _TokenLogProbs.apply(logits, labels.long(), chunk_size, False)[0]


def log_probs_and_entropy_from_logits(logits: torch.Tensor, labels: torch.Tensor,
                                      chunk_size: int = DEFAULT_CHUNK_SIZE) -> tuple[torch.Tensor, torch.Tensor]:
    """``(log_probs [...], entropy [...])``: :func:`log_probs_from_logits` and, from the same log-softmax, the
    entropy :func:`entropy_from_logits` gives (the same bits, one pass over the logits fewer). The entropy is not
    differentiable (a metric); for an entropy bonus use :func:`entropy_from_logits`."""
    _check_labels(logits, labels)
    return _TokenLogProbs.apply(logits, labels.long(), chunk_size, True)


def _check_labels(logits: torch.Tensor, labels: torch.Tensor) -> None:
    if tuple(labels.shape) != tuple(logits.shape[:-1]):
        raise ValueError(f"labels {tuple(labels.shape)} must match logits {tuple(logits.shape)} without the vocab dim")


def entropy_from_logits(logits: torch.Tensor, chunk_size: int = DEFAULT_CHUNK_SIZE) -> torch.Tensor:
    """Entropy (nats) of ``softmax(logits)`` per token: ``[..., vocab]`` → ``[...]``, computed chunk by chunk.

    Differentiable w.r.t. ``logits`` (for an entropy bonus); fp32 output (fp64 for fp64 logits).
    """
    return _Entropy.apply(logits, chunk_size)


def token_log_probs_and_entropy(logits: torch.Tensor, labels: torch.Tensor, *, with_entropy: bool,
                                entropy_grad: bool) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """``(log_probs, entropy or None)`` of ``logits [..., vocab]`` at ``labels [...]``: the log-probs differentiable,
    the entropy (``with_entropy``) only when ``entropy_grad`` and grad mode is on (an entropy bonus); a metric
    entropy comes from the log-probs' own log-softmax (:func:`log_probs_and_entropy_from_logits`)."""
    if not with_entropy:
        return log_probs_from_logits(logits, labels), None
    if entropy_grad and torch.is_grad_enabled():
        return log_probs_from_logits(logits, labels), entropy_from_logits(logits)
    return log_probs_and_entropy_from_logits(logits, labels)
