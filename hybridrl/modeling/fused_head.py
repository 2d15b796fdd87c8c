"""The actor's log-prob forward with the LM head fused into the log-softmax (``model.use_fused_kernels``).

The causal LM runs as usual up to its head; for the duration of one forward the head module's ``forward`` is replaced
by one that selects the scoring positions from its input (the final hidden states) and returns
:func:`hybridrl.algorithms.token_head.token_log_probs_from_hidden` of them, so no ``[tokens, vocab]`` logits exist.
It happens *inside* the model's forward on purpose: FSDP2 gathers the root's parameters (embeddings, final norm,
head) around that forward and hooks the backward on its outputs, and the one-rank mixed-precision casts
(:mod:`hybridrl.modeling.single_rank`) are swapped in only while it runs — the head's weight is the compute-dtype
tensor the plain path would multiply by, and its gradient takes the same way back.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Optional

import torch
from torch import nn

from hybridrl.algorithms.token_head import token_log_probs_from_hidden

__all__ = ["fused_head_log_probs", "output_head"]


def output_head(model: nn.Module) -> nn.Linear:
    """The model's LM head, checked to be a bias-free ``nn.Linear`` (what the fused path computes); ``ValueError``
    naming ``model.use_fused_kernels`` otherwise."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if not isinstance(head, nn.Linear) or head.bias is not None:
        raise ValueError(f"model.use_fused_kernels=true needs a causal LM whose output head is a bias-free "
                         f"nn.Linear; {type(model).__name__}'s is {type(head).__name__}: set "
                         f"model.use_fused_kernels=false")
    return head


@contextmanager
def _forward_replaced(module: nn.Module, forward: Callable[[torch.Tensor], torch.Tensor]) -> Iterator[None]:
    """``module.forward`` is ``forward`` inside the block (module hooks still run); restored after, also on error."""
    had_own = "forward" in module.__dict__
    previous = module.__dict__.get("forward")
    module.forward = forward
    try:
        yield
    finally:
        if had_own:
            module.forward = previous
        else:
            del module.forward


def fused_head_log_probs(model: nn.Module, inputs: dict, select: Callable[[torch.Tensor], torch.Tensor],
                         targets: torch.Tensor, *, temperature: float, with_entropy: bool,
                         entropy_grad: bool) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """``(log_probs [M], entropy [M] or None)`` of ``targets`` from one forward of ``model`` on ``inputs``.

    ``select`` maps the head's input ``[B', K, D]`` to the scoring positions ``[M, D]`` (a
    ``hybridrl.modeling.sequences.HeadCall``'s); ``targets`` ``[M]`` are the tokens they score. The entropy keeps
    its graph only when ``entropy_grad`` (an entropy bonus in the loss). fp32 outputs, as the plain path's.
    """
    head = output_head(model)

    def log_probs_head(hidden: torch.Tensor) -> torch.Tensor:
        log_probs, entropy = token_log_probs_from_hidden(select(hidden), head.weight, targets,
                                                         temperature=temperature, with_entropy=with_entropy)
        if entropy is None:
            return log_probs.unsqueeze(-1)
        return torch.stack([log_probs, entropy if entropy_grad else entropy.detach()], dim=-1)

    with _forward_replaced(head, log_probs_head):
        outputs = model(**inputs).logits  # [M, 1 or 2]: the model passes its head's output through
    return outputs[:, 0], (outputs[:, 1] if with_entropy else None)
