"""The actor's log-prob forward with the LM head run on the scored positions only.

The causal LM runs as usual up to its head; for the duration of one forward the head module's ``forward`` is replaced
by one that selects the scoring positions from its input (the final hidden states, ``[B', K, D]`` → ``[M, D]``) and
returns their log-probs (and entropies), ``[M, 1 or 2]``, fp32. It happens *inside* the model's forward on purpose:
FSDP2 gathers the root's parameters (embeddings, final norm, head) around that forward and hooks the backward on its
outputs, and the one-rank mixed-precision casts (:mod:`hybridrl.modeling.single_rank`) are swapped in only while it
runs — the head's weight is the compute-dtype tensor the plain path would multiply by, and its gradient takes the
same way back. Two variants:

- **selected** (the default wherever it is valid, :func:`runs_head_on_scored_positions`): the head's matmul on the
  ``[M, D]`` rows → ``[M, V]`` logits in the compute dtype, then the chunked log-softmax of
  :mod:`hybridrl.algorithms.logits`. Against running the head on all ``B'·K`` positions ``logits_to_keep`` can name
  and selecting afterwards, it skips the logits of positions that score nothing (the rows of a padded or
  shared-prompt layout end at different lengths), the fp32 copy of ``[B', K, V]`` the output cast makes, and the
  index and scatter of ``[*, V]`` tensors in backward. SmolLM2-135M, 2-core CPU, bf16, 4 micro-batches of 8
  shared-prompt rows, forward + backward: 5.78 → 5.23 s. Log-probs are the same bits; gradients differ by rounding
  (the head's weight gradient sums over ``M`` rows, not ``B'·K`` rows some of which are zero).
- **fused** (``model.use_fused_kernels``): :func:`hybridrl.algorithms.token_head.token_log_probs_from_hidden`, the
  head fused with the log-softmax chunk by chunk, so no ``[tokens, vocab]`` logits exist (memory for a second head
  matmul in backward).

Under sequence parallelism (:mod:`hybridrl.modeling.ulysses`) each rank of a group runs the head on its share of
the ``M`` rows and the log-probs are gathered: the ``[M, V]`` logits, what long responses at a large vocabulary
overflow on, are split ``SP`` ways.

Both need the model's forward to return its head's output unchanged: a bias-free ``nn.Linear`` head and a model type
whose forward does not rescale or soft-cap the logits after the head (Gemma-2's ``final_logit_softcapping``,
Cohere's ``logit_scale``, Granite's ``logits_scaling`` do). :data:`PASS_THROUGH_MODEL_TYPES` lists the types checked.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Optional

import torch
from torch import nn

from hybridrl.algorithms.logits import token_log_probs_and_entropy
from hybridrl.algorithms.token_head import token_log_probs_from_hidden
from hybridrl.modeling.ulysses import gather_rows, rows_of_rank, sequence_parallel_of

__all__ = ["PASS_THROUGH_MODEL_TYPES", "fused_output_head", "runs_head_on_scored_positions", "scored_head_log_probs"]

PASS_THROUGH_MODEL_TYPES = frozenset({
    "llama", "mistral", "ministral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "phi3", "gemma", "olmo",
    "olmo2", "starcoder2", "smollm3", "deepseek_v3", "glm4", "gpt_oss"})
"""Causal-LM types whose ``forward`` returns ``lm_head(hidden[:, keep])`` as the logits, nothing applied after
(checked against transformers' modelling code). Others (soft-capped, rescaled, remote code) keep the plain path."""


def _bias_free_head(model: nn.Module) -> Optional[nn.Linear]:
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return head if isinstance(head, nn.Linear) and head.bias is None else None


def _model_type(model: nn.Module) -> Optional[str]:
    return getattr(getattr(model, "config", None), "model_type", None)


def runs_head_on_scored_positions(model: nn.Module) -> bool:
    """Whether the head can run on the scored positions alone: a bias-free ``nn.Linear`` head on a model type of
    :data:`PASS_THROUGH_MODEL_TYPES`."""
    return _bias_free_head(model) is not None and _model_type(model) in PASS_THROUGH_MODEL_TYPES


def fused_output_head(model: nn.Module) -> nn.Linear:
    """The model's LM head for ``model.use_fused_kernels``; ``ValueError`` naming the key when the head is not a
    bias-free ``nn.Linear`` or the model type may transform its output (module docstring)."""
    head = _bias_free_head(model)
    if head is None:
        found = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        raise ValueError(f"model.use_fused_kernels=true needs a causal LM whose output head is a bias-free "
                         f"nn.Linear; {type(model).__name__}'s is {type(found).__name__}: set "
                         f"model.use_fused_kernels=false")
    if _model_type(model) not in PASS_THROUGH_MODEL_TYPES:
        raise ValueError(f"model.use_fused_kernels=true is checked for the model types "
                         f"{sorted(PASS_THROUGH_MODEL_TYPES)}, whose forward returns the head's output unchanged; "
                         f"this model is {_model_type(model)!r} (it may soft-cap or rescale its logits): set "
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


def _selected_head(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, *, temperature: float,
                   with_entropy: bool, entropy_grad: bool) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """``(log_probs [M], entropy [M] or None)`` from ``[M, D]`` hidden states through ``[M, V]`` logits. The plain
    path's numbers: logits in the compute dtype, fp32 before a temperature divides them, the log-softmax in fp32
    chunks (which cast as they go, so bf16 logits need no fp32 copy at temperature 1)."""
    logits = torch.nn.functional.linear(hidden, weight)
    if temperature != 1.0:
        logits = logits.float() / temperature
    return token_log_probs_and_entropy(logits, targets, with_entropy=with_entropy, entropy_grad=entropy_grad)


def scored_head_log_probs(model: nn.Module, inputs: dict, select: Callable[[torch.Tensor], torch.Tensor],
                          targets: torch.Tensor, *, temperature: float, with_entropy: bool, entropy_grad: bool,
                          fused: bool) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """``(log_probs [M], entropy [M] or None)`` of ``targets`` from one forward of ``model`` on ``inputs``.

    ``select`` maps the head's input ``[B', K, D]`` to the scoring positions ``[M, D]`` (a
    ``hybridrl.modeling.sequences.HeadCall``'s); ``targets`` ``[M]`` are the tokens they score. ``fused``: the
    fused variant (module docstring), else the selected one. The entropy keeps its graph only when
    ``entropy_grad`` (an entropy bonus in the loss). fp32 outputs, as the plain path's.
    """
    head = fused_output_head(model) if fused else _bias_free_head(model)
    if head is None:
        raise ValueError(f"the LM head on the scored positions needs a bias-free nn.Linear head; "
                         f"{type(model).__name__} has none (see runs_head_on_scored_positions)")

    sp = sequence_parallel_of(model)

    def log_probs_head(hidden: torch.Tensor) -> torch.Tensor:
        rows, scored = select(hidden), targets
        if sp is not None:  # each rank of a sequence-parallel group scores its share of the rows
            rows, scored = rows_of_rank(rows, sp), rows_of_rank(targets, sp)
        if fused:
            log_probs, entropy = token_log_probs_from_hidden(rows, head.weight, scored,
                                                             temperature=temperature, with_entropy=with_entropy)
        else:
            log_probs, entropy = _selected_head(rows, head.weight, scored, temperature=temperature,
                                                with_entropy=with_entropy, entropy_grad=entropy_grad)
        if entropy is None:
            outputs = log_probs.unsqueeze(-1)
        else:
            outputs = torch.stack([log_probs, entropy if entropy_grad else entropy.detach()], dim=-1)
        return outputs if sp is None else gather_rows(outputs, sp, len(targets))

    with _forward_replaced(head, log_probs_head):
        outputs = model(**inputs).logits  # [M, 1 or 2]: the model passes its head's output through
    return outputs[:, 0], (outputs[:, 1] if with_entropy else None)
