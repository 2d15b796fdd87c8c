"""Generation's linear layers on CPU against oneDNN-prepacked weights (bf16 and fp32).

A bf16 ``F.linear`` on CPU reorders its weight into oneDNN's blocked layout on every call. In a decode step the
matmuls have few rows (the sequences being sampled), so that reorder is a large share of each call: measured on the
2-core AMD EPYC (AVX-512 BF16), 32 rows, SmolLM2-135M's shapes: 576→1536 200 → 153 µs, 1536→576 187 → 161 µs,
576→576 96 → 71 µs, the 576→49152 head 8.8 → 5.8 ms. An fp32 ``F.linear`` runs MKL's sgemm, which at a few rows
runs far below its large-matrix rate; oneDNN's packed fp32 product is 1.5–2.5× faster there (same machine, 32 rows:
576→1536 463 → 277 µs, 1536→576 466 → 300 µs, the head 26.7 → 10.6 ms; capped at AVX2, as on an AVX2-only CPU,
533 → 315 µs and 32.2 → 15.1 ms). Inside :func:`linears_prepacked` each ``nn.Linear`` reorders its weight once, at its
first call, and multiplies against that copy until the context exits (torch's ``mkldnn._reorder_linear_weight`` /
``mkldnn._linear_pointwise``, what inductor's CPU freezing uses). In bf16 the products are the same bits as
``F.linear`` (both are oneDNN's; checked over decode, prefill and 3-D shapes, with and without bias) up to a few
hundred rows: from 295 rows (576→576) on 2 threads ``F.linear`` splits the sum otherwise, and a SmolLM2-shaped
prompt forward of 8 × 43 tokens sampled other tokens packed than plain. So only products of at most
:data:`PACKED_MAX_ROWS` rows, and one-token decode steps at any row count (what the fast decode step packs too),
run packed: the prompts' forward then runs ``F.linear`` whichever decode path follows. In fp32 they
differ from MKL's in the last bits (≤ 6e-6 absolute at SmolLM2's head); a row's result does not depend on how many
rows run beside it from two rows up (MKL's does below 16 rows; a single row can take another kernel in both).

Only bf16 is packed by default (:data:`PACKED_DTYPES` says why not fp32).

Used where the weights cannot change: ``generate`` with grad off, its casts kept (``single_rank.casts_kept``). A
layer whose weight tensor changes between calls (casts not kept) goes back to ``F.linear`` for good, so nothing is
packed twice.
"""

from __future__ import annotations

import functools
from contextlib import contextmanager
from typing import Iterator, Optional

import torch
import torch.nn.functional as F
from torch import nn

_DECODE_ROWS_HINT = 32
"""Rows oneDNN tunes the packed layout for (any row count gives the same result)."""


PACKED_DTYPES = (torch.bfloat16,)
"""fp32 is not packed by default, though its products run 1.2–1.6× faster packed (above): with it, the 200-step
soak's rank-1 RSS rose 1.6–2 MiB at about step 176 (a late slope of 0.032–0.046 MiB/step against the test's 0.03,
in 5 runs). Traced: that is the rank's first decode step of 2 rows, which compiles oneDNN kernels for the 5 product
shapes of that row count. Repacking the weights every ``generate`` is not it (3000 repacks of the tiny shapes: +1 MiB
within the first 500, flat after). It is a one-off compile per new row count, bounded by the kernel cache
(``trainer.ray.cpu_kernel_cache_capacity``), not a leak, but the soak cannot tell the two apart; fp32 stays on
MKL's ``F.linear`` (no per-shape kernels) until it can. Add ``torch.float32`` here to measure it."""


PACKED_MAX_ROWS = 64
"""Products of more rows than this run ``F.linear``, unless they are one-token decode steps (module docstring):
the reorder a packed weight saves is a large share of a few-row product, a small one of a prompt's forward."""


@functools.lru_cache(maxsize=None)
def prepacking_available(dtype: torch.dtype = torch.bfloat16) -> bool:
    """Whether generation packs ``dtype`` products for oneDNN on this CPU: a dtype of :data:`PACKED_DTYPES` and this
    build's kernels for it (bf16: x86 CPUs with native bf16, AVX-512 BF16 / AMX). Asked at every packed call, so
    answered once."""
    mkldnn_ops = getattr(torch.ops, "mkldnn", None)
    kernels = (torch.backends.mkldnn.is_available() and hasattr(mkldnn_ops, "_reorder_linear_weight")
               and hasattr(mkldnn_ops, "_linear_pointwise"))
    if dtype == torch.bfloat16:
        return kernels and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    return kernels and dtype in PACKED_DTYPES


def pack_linear_weight(weight: torch.Tensor) -> torch.Tensor:
    """A bf16 / fp32 CPU weight ``[out, in]`` reordered once into oneDNN's layout for :func:`packed_linear`."""
    return torch.ops.mkldnn._reorder_linear_weight(weight, _DECODE_ROWS_HINT)


def packed_linear(input: torch.Tensor, packed: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """``F.linear(input, weight, bias)`` against ``pack_linear_weight(weight)`` (bf16: the same bits)."""
    return torch.ops.mkldnn._linear_pointwise(input, packed, bias, "none", [], "")


class _PackedLinear:
    """The forward one ``nn.Linear`` runs inside :func:`linears_prepacked`."""

    def __init__(self, module: nn.Linear) -> None:
        self.module = module
        self.weight = None  # the tensor packed, kept so that an identity check cannot see a recycled id
        self.packed = None
        self.unstable = False

    def __call__(self, input: torch.Tensor) -> torch.Tensor:
        weight, bias = self.module.weight, self.module.bias
        if not self._packable(input, weight):
            return F.linear(input, weight, bias)
        if self.weight is not weight:
            if self.weight is not None:  # its weight changed between calls: packing would repeat every call
                self.unstable, self.weight, self.packed = True, None, None
                return F.linear(input, weight, bias)
            self.weight, self.packed = weight, pack_linear_weight(weight)
        return packed_linear(input, self.packed, bias)

    def _packable(self, input: torch.Tensor, weight: torch.Tensor) -> bool:
        dtype = weight.dtype
        return (not self.unstable and not torch.is_grad_enabled() and type(weight) in (torch.Tensor, nn.Parameter)
                and _decode_shaped(input) and input.dtype == dtype and weight.device.type == "cpu"
                and input.device.type == "cpu"
                and (self.module.bias is None or self.module.bias.dtype == dtype) and prepacking_available(dtype))


def _decode_shaped(input: torch.Tensor) -> bool:
    """Whether ``input [..., in]`` is a product to pack: at most :data:`PACKED_MAX_ROWS` rows, or ``[A, 1, in]``."""
    rows = input.numel() // max(input.shape[-1], 1)
    return rows <= PACKED_MAX_ROWS or (input.dim() == 3 and input.shape[1] == 1)


@contextmanager
def linears_prepacked(model: nn.Module, enabled: bool = True) -> Iterator[None]:
    """Inside, every plain ``nn.Linear`` of ``model`` (not subclasses such as LoRA layers) runs bf16 / fp32 CPU
    products with grad off against a weight packed at its first call; anything else goes to ``F.linear`` as before.
    The packed copies (the size of the weights) are dropped on exit. A no-op when ``enabled`` is false or the build
    lacks the kernels (:func:`prepacking_available`)."""
    compiled = any(getattr(module, "_compiled_call_impl", None) is not None for module in model.modules())
    packable = any(prepacking_available(dtype) for dtype in PACKED_DTYPES)
    if not enabled or compiled or not packable:  # compiled layers: inductor does its own packing
        yield
        return
    linears = [module for module in model.modules() if type(module) is nn.Linear and "forward" not in vars(module)]
    for module in linears:
        module.forward = _PackedLinear(module)
    try:
        yield
    finally:
        for module in linears:
            del module.forward
