"""Micro-batch sizing from memory: an analytic model of a Hugging Face decoder's training memory, two honest ways to
measure it, and the rule that turns a per-device budget into ``micro_batch_size × grad_accum_steps``.

Practitioners size the micro-batch by probing one forward/backward at the *longest* expected sequence and keeping
10–20 % headroom; the accumulation steps then follow from ``global = micro × accumulation × world`` (docs/architecture.md §3).

**The analytic model** (bytes; ``c`` = compute-dtype bytes, ``h`` hidden, ``I`` intermediate, ``a`` attention heads,
``d`` head dim, ``q = a·d``, ``kv`` = KV heads × d, ``V`` vocab, ``L`` layers). It counts what autograd *saves for
backward* in transformers' Llama/Qwen2 layers with ``sdpa`` — derived op by op and checked against a saved-tensor
counter (``tests/unit/workers/test_memory_sizing.py``: saved bytes within 0.2 %, peaks within 10 %):

- per layer, per token: ``2·(4h + 4 + c·h)`` (two RMSNorms: the fp32 input, the fp32 ``rsqrt``, the normalised
  output cast back) ``+ 2·c·h`` (inputs of the q/k/v and gate/up projections) ``+ c·(2q + 2kv) + 4a`` (roped q, roped
  k, v, attention output, fp32 log-sum-exp; the o-projection input shares the output's storage) ``+ 4·c·I`` (gate,
  up, SiLU and product). With an explicit attention mask (padding, or packed sequences under ``sdpa``) k and v are
  repeated to q's width (``c·4q``) and each layer saves its own float copy of the mask: ``c · rows · row_length²``
  per layer. ``flash_attention_2`` (varlen) has neither. The CPU kernel of ``attn_implementation=auto`` on short
  rows (``hybridrl.modeling.attention``) saves no log-sum-exp but each head's fp32 softmax and its compute-dtype copy,
  ``(4 + c) · a · row_length²`` per row per layer (``4 ·`` in fp32), k and v unrepeated (the query heads are folded
  into their KV head's rows), and references the boolean mask once.
- with activation checkpointing a layer saves only its input, ``c·h`` per token (plus one layer's full set while it
  is recomputed in backward).
- after the layers: ``4h + 4 + c·h`` per token (final norm) and ``c·h`` per LM-head position (its input: a causal LM
  runs its head only on the positions the loss scores, ``logits_to_keep``); shared: 8 (token ids) ``+ 2·d·c`` (rope
  tables).
- logits (:func:`logits_bytes_peaks`): ``[N_head, V]`` logits and the ``[M, V]`` response logits the loss saves in
  forward; in backward up to ``[M, V] + 2·[G, V]`` (the boolean gather's out-of-place ``index_put``) or ``[N, V]``
  plus the LM head's ``[V, h]`` weight gradient. At a 150k vocabulary this, not the layers, is often what overflows.
  These are the reference head path's (``hybridrl.modeling.scored_head``); the default path on pass-through model
  types runs the head on the ``M`` scored positions in the compute dtype and holds less, so they bound it above.
- model states per rank under FSDP2 over ``W`` ranks: fp32 master parameters, fp32 gradients and AdamW's two fp32
  moments, each ``/ W``; plus the all-gathered compute-dtype parameters in flight (the root group and two layers —
  the current one and the prefetched one) and their unsharded gradients; plus, **while accumulating with
  ``fsdp.grad_sync=step``** (``set_requires_gradient_sync(False)`` on all but the last micro-batch), the unsharded
  gradients of the *whole* model in the reduce dtype, which FSDP2 keeps between micro-batches. That last term is the
  memory price of one reduce-scatter per step; ``grad_sync=micro_batch`` reduce-scatters every micro-batch instead
  and holds only the sharded gradients (``accumulating=False`` here).

**Measuring.** CUDA: ``max_memory_allocated()`` after ``reset_peak_memory_stats()``. CPU has no allocator statistics:
:class:`LiveTensorPeak` follows every tensor storage created in forward and backward (a lower bound of what an
allocator holds: no kernel workspaces, caching or fragmentation); :class:`SavedTensorBytes` counts what autograd saves.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field, replace
from typing import Optional, Sequence


from hybridrl.algorithms.logits import DEFAULT_CHUNK_SIZE
from hybridrl.modeling.attention import computes_directly
from hybridrl.autotune.decoder_shape import DecoderShape
# The measurement side lives next door; re-exported so callers need one import.
from hybridrl.autotune.memory_probe import (  # noqa: F401
    LiveTensorPeak,
    MeasureFn,
    SavedTensorBytes,
    make_probe,
    probe_peak_bytes,
    resident_bytes,
)

logger = logging.getLogger(__name__)

FP32 = 4
# (micro_batch_size, seq_len) -> peak bytes of one forward+backward on this rank (math.inf: does not fit)


# ------------------------------------------------------------------------------------------------ the model's shape
# -------------------------------------------------------------------------------------------- activations (analytic)
@dataclass(frozen=True)
class ForwardLayout:
    """How a micro-batch enters the model: ``num_rows × row_length`` tokens, ``num_loss_tokens`` of them scored.

    ``response_width``: columns the loss gathers from (padded: the response width ``R``; packed: none, see
    ``gathers``). ``masked``: sdpa receives an explicit mask (any padding in a padded batch, or packed sequences under
    sdpa); ``False`` for an unpadded batch (causal flag) or ``flash_attention_2`` varlen. ``head_positions``: the
    positions the LM head runs on (``logits_to_keep``; padded: the ``R`` before the last of each row, packed: the scored
    tokens' sources); ``gathers``: the scored logits are a boolean-index copy (padded) rather than the head's output
    itself (packed).
    """

    num_rows: int
    row_length: int
    num_loss_tokens: int
    response_width: int
    masked: bool = True
    head_positions: Optional[int] = None
    gathers: bool = True
    direct_attention: bool = False
    sequence_parallel: int = 1
    """Ranks that split each row's positions (Ulysses): each holds ``1/SP`` of every per-token activation and of the
    attention scores (``1/SP`` of the heads over whole rows); the mask, the gathered hidden states after the layers
    and the logits stay whole on every rank."""

    @classmethod
    def padded(cls, micro_batch_size: int, seq_len: int, response_length: Optional[int] = None, *,
               masked: bool = True, attention: str = "sdpa") -> "ForwardLayout":
        """Rows of ``seq_len`` (the batch's padded width); responses (default: all columns) are all scored.
        ``attention``: the resolved kernel name (``hybridrl.modeling.attention.attention_implementation``)."""
        response = seq_len if response_length is None else response_length
        return cls(micro_batch_size, seq_len, micro_batch_size * response, response, masked=masked,
                   head_positions=micro_batch_size * min(seq_len, response),
                   direct_attention=computes_directly(attention, seq_len))

    @classmethod
    def packed(cls, num_tokens: int, num_loss_tokens: Optional[int] = None, *,
               attention: str = "sdpa") -> "ForwardLayout":
        """One packed row of ``num_tokens``; sdpa builds an ``[N, N]`` block-diagonal mask, varlen flash does not."""
        loss_tokens = num_tokens if num_loss_tokens is None else num_loss_tokens
        return cls(1, num_tokens, loss_tokens, 0, masked=attention != "flash_attention_2", head_positions=loss_tokens,
                   gathers=False, direct_attention=computes_directly(attention, num_tokens))

    @property
    def num_tokens(self) -> int:
        return self.num_rows * self.row_length

    @property
    def local_tokens(self) -> int:
        """Tokens this rank holds between the layers: ``num_tokens / SP``, rounded up (rows are padded to a
        multiple of SP)."""
        return self.num_rows * -(-self.row_length // self.sequence_parallel)

    def split(self, sequence_parallel: int) -> "ForwardLayout":
        """This layout with its rows' positions split over ``sequence_parallel`` ranks."""
        return replace(self, sequence_parallel=sequence_parallel)

    def head_share(self) -> "ForwardLayout":
        """What one rank's LM head runs on: all of it, or split over SP ranks its share of the scored rows (the
        scored-head path, :mod:`hybridrl.modeling.scored_head`: no gather, the head on those rows only). A model type
        whose logits are transformed after the head (soft-capped, rescaled: not in ``PASS_THROUGH_MODEL_TYPES``)
        runs the whole head on every rank, which this under-counts."""
        if self.sequence_parallel == 1:
            return self
        share = -(-self.num_loss_tokens // self.sequence_parallel)
        return replace(self, num_loss_tokens=share, head_positions=share, gathers=False, response_width=0)

    @property
    def num_head_positions(self) -> int:
        return self.num_tokens if self.head_positions is None else self.head_positions


@dataclass(frozen=True)
class ActivationBytes:
    """Activation memory of one micro-batch, in bytes. ``saved``: what autograd holds at the end of forward (logits
    excluded); ``peak`` adds the largest transient (logits in forward or backward, or a checkpointed recompute)."""

    per_layer: int
    final: int
    shared: int
    logits_forward: int
    logits_backward: int
    recompute: int

    @property
    def saved(self) -> int:
        return self.per_layer + self.final + self.shared

    @property
    def peak(self) -> int:
        return self.saved + max(self.logits_forward, self.logits_backward, self.recompute)


def layer_bytes_per_token(shape: DecoderShape, compute_bytes: int, masked: bool) -> int:
    """Bytes one decoder layer saves for backward per token, without checkpointing (mask excluded; see module doc)."""
    c, h = compute_bytes, shape.hidden_size
    norms = 2 * (FP32 * h + FP32 + c * h)
    projection_inputs = 2 * c * h
    key_value_width = shape.q_width if masked else shape.kv_width  # repeat_kv copies k and v when a mask is given
    attention = c * (2 * shape.q_width + 2 * key_value_width) + FP32 * shape.num_heads
    mlp = 4 * c * shape.active_intermediate_size
    return norms + projection_inputs + attention + mlp


def attention_layer_bytes(shape: DecoderShape, layout: ForwardLayout, compute_bytes: int) -> int:
    """Bytes one decoder layer saves for ``layout`` without checkpointing: the per-token terms plus the attention's
    per-row terms (sdpa: a float copy of an explicit mask; the direct CPU kernel: the softmax in fp32 and in the
    compute dtype, and a causal ``[T, T]`` boolean mask when none is given). Split over SP ranks, each holds
    ``1/SP`` of the tokens' terms and of the scores (``1/SP`` of the heads), and the whole mask."""
    c, rows, length, n = compute_bytes, layout.num_rows, layout.row_length, layout.local_tokens
    if not layout.direct_attention:
        mask = c * rows * length ** 2 if layout.masked else 0
        # split, the o-projection's input is the second all-to-all's output, not sdpa's saved output (without a mask
        # sdpa keeps its own; with one, transformers' repeat already made them two)
        exchanged = c * shape.q_width if layout.sequence_parallel > 1 and not layout.masked else 0
        return n * (layer_bytes_per_token(shape, c, layout.masked) + exchanged) + mask
    softmax_copy = c if c != FP32 else 0  # in fp32 the weights are the softmax output itself
    heads = shape.num_heads // layout.sequence_parallel
    scores = (FP32 + softmax_copy) * rows * heads * length ** 2
    causal = 0 if layout.masked else length ** 2
    # the query heads are folded into their KV head's rows: k and v are not repeated
    return n * (layer_bytes_per_token(shape, c, masked=False) - FP32 * shape.num_heads) + scores + causal


def logits_bytes_peaks(shape: DecoderShape, layout: ForwardLayout, *, compute_bytes: int = FP32,
                       logits_bytes: int = FP32, chunk_size: int = DEFAULT_CHUNK_SIZE) -> tuple[int, int]:
    """``(forward, backward)`` peak bytes of the logits path on top of the layers' saved activations.

    ``N`` positions under the LM head (``layout.num_head_positions``), ``M`` scored tokens, ``G = rows ×
    response_width`` gathered positions (0 when packed: the head's output is the scored logits), ``b`` =
    ``logits_bytes``, chunk = ``min(M, chunk_size) · V · 4`` (``hybridrl.algorithms.logits`` works in fp32 chunks).
    Forward: ``[N, V]`` logits (+ a ``b``-byte cast) and the gathered ``[M, V]`` copy the log-prob function saves, or
    that copy and two chunks of working set. Backward, the largest of the steps in order: the log-prob backward
    (saved ``[M, V]``, its gradient, one chunk), the gather's backward (``new_zeros([G, V]).index_put(...)`` is
    out of place: the ``[M, V]`` gradient and two ``[G, V]`` tensors), the slice/select backward into ``[N, V]``,
    the cast back, and the LM head's ``[V, h]`` weight and ``[N, h]`` input gradients.
    """
    c, h, n, v, b = compute_bytes, shape.hidden_size, layout.num_head_positions, shape.vocab_size, logits_bytes
    m, g = layout.num_loss_tokens, layout.num_rows * layout.response_width if layout.gathers else 0
    gathered = m * v * b if layout.gathers else 0
    chunk = min(m, chunk_size) * v * FP32
    upcast = chunk if b != FP32 else 0  # a low-precision chunk is copied to fp32 first
    cast = n * v * b if b != c else 0
    forward = max(n * v * c + cast + gathered, m * v * b + 2 * chunk + upcast)
    backward = max(2 * m * v * b + chunk + upcast,        # log-prob backward
                   gathered + 2 * g * v * b,              # index backward (out-of-place index_put)
                   g * v * b + n * v * b,                 # slice / select backward
                   n * v * b + (n * v * c if cast else 0),  # cast backward
                   n * v * c + v * h * FP32 + n * h * c)  # LM head backward
    return forward, backward


def activation_bytes(shape: DecoderShape, layout: ForwardLayout, *, compute_bytes: int = FP32,
                     logits_bytes: int = FP32, checkpointing: bool = False) -> ActivationBytes:
    """The analytic activation memory of one forward+backward of ``layout`` (formulas in the module docstring).
    With ``layout.sequence_parallel`` > 1 the layers' terms and the logits are this rank's share; what follows the
    layers (the gathered hidden states, final norm, head input) and the rope tables are whole.

    ``logits_bytes``: the dtype the loss sees the logits in (4 under FSDP2's ``output_dtype=float32``; a plain bf16
    model hands bf16 logits to the loss).
    """
    c, h, n, local = compute_bytes, shape.hidden_size, layout.num_tokens, layout.local_tokens
    full_layer = attention_layer_bytes(shape, layout, c)
    per_layer = shape.num_layers * (local * c * h if checkpointing else full_layer)
    if checkpointing and layout.sequence_parallel > 1:
        per_layer += (n - local) * c * h  # the first layer's checkpoint holds the whole embedding output it slices
    final = n * (FP32 * h + FP32 + c * h) + layout.num_head_positions * c * h  # final norm; LM-head input
    rope = n * 2 * shape.head_dim * c
    shared = n * 8 + (0 if checkpointing else rope)  # checkpointed layers hold the rope tables, they do not save them
    if layout.direct_attention and layout.masked:
        shared += layout.num_rows * layout.row_length ** 2  # the boolean mask every layer references
    logits_forward, logits_backward = logits_bytes_peaks(shape, layout.head_share(), compute_bytes=c,
                                                         logits_bytes=logits_bytes)
    # While a checkpointed layer is recomputed: its full saved set, the held rope tables, and the gradient
    # temporaries of its backward (one [N, I], two [N, h]).
    recompute = full_layer + rope + local * c * (shape.active_intermediate_size + 2 * h) if checkpointing else 0
    return ActivationBytes(per_layer=per_layer, final=final, shared=shared, logits_forward=logits_forward,
                           logits_backward=logits_backward, recompute=recompute)


# --------------------------------------------------------------------------------------------- model states (FSDP2)
@dataclass(frozen=True)
class Precision:
    """Bytes per element: compute (FSDP ``param_dtype``), master weights, gradients (``reduce_dtype``), and optimizer
    state per parameter (AdamW: two fp32 moments)."""

    compute_bytes: int = FP32
    master_bytes: int = FP32
    grad_bytes: int = FP32
    optimizer_bytes_per_param: int = 2 * FP32


@dataclass(frozen=True)
class ModelStateBytes:
    """Per-rank bytes of parameters, gradients and optimizer state (see the module docstring). ``gathered``: the
    all-gathered compute-dtype parameters in flight; ``gathered_gradients``: the unsharded gradients in flight to
    their reduce-scatter (backward only); ``accumulated_gradients``: the whole model's unsharded gradients held
    between micro-batches (``grad_sync=step``)."""

    parameters: int
    gradients: int
    optimizer: int
    gathered: int
    accumulated_gradients: int
    gathered_gradients: int = 0

    @property
    def total(self) -> int:
        return (self.parameters + self.gradients + self.optimizer + self.gathered + self.gathered_gradients
                + self.accumulated_gradients)


def model_state_bytes(shape: DecoderShape, *, world_size: int = 1, precision: Precision = Precision(),
                      accumulating: bool = False, gather_once: bool = False) -> ModelStateBytes:
    """Parameters, gradients, optimizer states per rank under FSDP2 over ``world_size`` ranks (1: no sharding).

    ``accumulating``: gradient accumulation with sync only on the last micro-batch (``fsdp.grad_sync=step`` and
    more than one micro-batch), so FSDP2 holds the whole model's unsharded gradients between micro-batches (one
    ``reduce_scatter`` per step instead of one per micro-batch). ``grad_sync=micro_batch`` is ``False`` here: the
    gradients stay sharded.
    Those replace, rather than add to, the sharded gradients (set to ``None`` after each optimizer step and produced
    layer by layer by the final reduce-scatter) and the in-flight unsharded gradients.
    ``gather_once`` (``fsdp.gather_once``): the whole model's parameters stay gathered in the compute dtype through
    the step, instead of the root and two layers at a time.
    """
    total = shape.num_parameters()
    sharded = -(-total // world_size)
    gradients, gathered, in_flight, accumulated = precision.grad_bytes * sharded, 0, 0, 0
    if world_size > 1 or precision.compute_bytes != precision.master_bytes:
        # One rank holds a cast copy too when it computes in another dtype: with gather_once the whole model's
        # casts (hybridrl.modeling.single_rank, no FSDP2; measured on one H200 at 494 M parameters in bf16 under
        # FSDP2: 0.67 GiB above the root and layers in flight), else FSDP2's per-group copies. In fp32 one rank
        # with gather_once casts nothing; without it FSDP2 gathers into buffers of its own, left out here.
        gathered = precision.compute_bytes * (total if gather_once
                                              else shape.root_parameters() + 2 * shape.layer_parameters())
    if world_size > 1:
        if accumulating:
            gradients, accumulated = 0, precision.grad_bytes * total
        else:
            in_flight = precision.grad_bytes * (shape.root_parameters() + shape.layer_parameters())
    return ModelStateBytes(parameters=precision.master_bytes * sharded, gradients=gradients,
                           optimizer=precision.optimizer_bytes_per_param * sharded, gathered=gathered,
                           accumulated_gradients=accumulated, gathered_gradients=in_flight)


@dataclass(frozen=True)
class MemoryEstimate:
    """Predicted peak bytes of one micro-batch's forward+backward on one rank: states + activation peak."""

    states: ModelStateBytes
    activations: ActivationBytes

    @property
    def total(self) -> int:
        return self.states.total + self.activations.peak


def estimate_micro_batch_bytes(shape: DecoderShape, micro_batch_size: int, seq_len: int, *,
                               world_size: int = 1, precision: Precision = Precision(),
                               checkpointing: bool = False, packed: bool = False, attention: str = "sdpa",
                               accumulating: bool = True, logits_bytes: int = FP32,
                               gather_once: bool = False, sequence_parallel: int = 1) -> MemoryEstimate:
    """Worst case of ``micro_batch_size`` sequences of ``seq_len`` tokens, every token scored (padded: masked rows of
    ``seq_len``; packed: one row of ``micro_batch_size · seq_len`` tokens), split over ``sequence_parallel`` ranks."""
    if packed:
        layout = ForwardLayout.packed(micro_batch_size * seq_len, attention=attention)
    else:
        layout = ForwardLayout.padded(micro_batch_size, seq_len, masked=attention != "flash_attention_2",
                                      attention=attention)
    return MemoryEstimate(
        states=model_state_bytes(shape, world_size=world_size, precision=precision, accumulating=accumulating,
                                 gather_once=gather_once),
        activations=activation_bytes(shape, layout.split(sequence_parallel), compute_bytes=precision.compute_bytes,
                                     logits_bytes=logits_bytes, checkpointing=checkpointing))


def analytic_measure_fn(shape: DecoderShape, **options) -> MeasureFn:
    """A :data:`MeasureFn` from the analytic model (for CPU, or to pre-screen candidates before probing a GPU)."""
    return lambda micro_batch_size, seq_len: float(
        estimate_micro_batch_bytes(shape, micro_batch_size, seq_len, **options).total)


# --------------------------------------------------------------------------------------------------------- decision
@dataclass(frozen=True)
class MicroBatchDecision:
    """The chosen micro-batch (sequences per forward/backward on one device) and its consequences.

    ``measured`` maps each probed candidate to its bytes (probing stops at the first that does not fit).
    """

    micro_batch_size: int
    grad_accum_steps: int
    predicted_bytes: float
    usable_bytes: float
    reason: str
    measured: dict[int, float] = field(default_factory=dict)


def format_bytes(value: float) -> str:
    if math.isinf(value):
        return "out of memory"
    return f"{value / 2**30:.2f} GiB" if value >= 2**30 else f"{value / 2**20:.1f} MiB"


def choose_micro_batch_size(budget_bytes: float, *, seq_len: int, local_mini_batch_size: int,
                            measure_fn: MeasureFn, headroom: float = 0.15,
                            candidates: Optional[Sequence[int]] = None, world_size: int = 1,
                            log: bool = True) -> MicroBatchDecision:
    """The largest candidate micro-batch that fits ``budget_bytes × (1 − headroom)`` and divides the local mini-batch.

    Args:
        budget_bytes: device memory this rank may use (e.g. total GPU memory minus what the rollout engine keeps).
        seq_len: the longest expected sequence (max prompt + max response tokens): memory is sized for the worst case.
        local_mini_batch_size: sequences per optimizer step on this rank (global mini-batch × n ÷ DP ranks).
        measure_fn: ``(micro_batch_size, seq_len) -> peak bytes`` — :func:`make_probe` or :func:`analytic_measure_fn`.
        headroom: fraction of the budget kept free (fragmentation, allocator caching, kernels' workspaces).
        candidates: sizes to consider (default: powers of two up to ``local_mini_batch_size``); those not dividing
            the local mini-batch are skipped unmeasured, since ``global = micro × accumulation × world`` must hold.
        world_size: data-parallel ranks (only for the identity in the logged reason).
        log: log the reason here (a caller that logs a fuller line of its own passes ``False``).

    Memory grows with the micro-batch, so candidates are probed in ascending order and probing stops at the first
    that does not fit: the largest (most expensive, OOM-prone) sizes are never tried needlessly.

    Raises:
        ValueError: bad arguments, no candidate divides the local mini-batch, or even the smallest does not fit.
    """
    if budget_bytes <= 0:
        raise ValueError(f"budget_bytes must be positive, got {budget_bytes}")
    if not 0 <= headroom < 1:
        raise ValueError(f"headroom must be in [0, 1), got {headroom}")
    if local_mini_batch_size < 1 or seq_len < 1:
        raise ValueError(f"local_mini_batch_size and seq_len must be >= 1, got {local_mini_batch_size}, {seq_len}")
    if candidates is None:
        candidates = [2 ** k for k in range(local_mini_batch_size.bit_length()) if 2 ** k <= local_mini_batch_size]
    if any(int(size) != size or size < 1 for size in candidates):
        raise ValueError(f"candidates must be positive integers, got {list(candidates)}")
    dividing = sorted({int(size) for size in candidates if local_mini_batch_size % size == 0})
    if not dividing:
        raise ValueError(f"no candidate micro-batch size in {sorted(candidates)} divides the local mini-batch of "
                         f"{local_mini_batch_size} sequences")
    usable = budget_bytes * (1 - headroom)
    measured: dict[int, float] = {}
    for size in dividing:
        measured[size] = float(measure_fn(size, seq_len))
        if not measured[size] <= usable:
            break
    fitting = [size for size, value in measured.items() if value <= usable]
    if not fitting:
        smallest = dividing[0]
        raise ValueError(f"even micro_batch_size={smallest} at seq_len={seq_len} needs "
                         f"{format_bytes(measured[smallest])}, over the usable {format_bytes(usable)} "
                         f"(budget {format_bytes(budget_bytes)}, {headroom:.0%} headroom); enable activation "
                         "checkpointing, shard over more ranks, offload parameters, or shorten sequences")
    size = max(fitting)
    steps = local_mini_batch_size // size
    reason = (f"micro_batch_size={size}, grad_accum_steps={steps} (global {size} x {steps} x {world_size} = "
              f"{size * steps * world_size} sequences) at seq_len={seq_len}: {format_bytes(measured[size])} <= usable "
              f"{format_bytes(usable)} (budget {format_bytes(budget_bytes)}, {headroom:.0%} headroom)")
    larger = [candidate for candidate in measured if candidate > size]
    if larger:
        reason += f"; {larger[0]} would need {format_bytes(measured[larger[0]])}"
    elif size == dividing[-1]:
        reason += "; the largest candidate dividing the local mini-batch"
    decision = MicroBatchDecision(micro_batch_size=size, grad_accum_steps=steps, predicted_bytes=measured[size],
                                  usable_bytes=usable, reason=reason, measured=measured)
    if log:
        logger.info("micro-batch sizing: %s", reason)
    return decision

