"""Checked weight sync: per-parameter fingerprints computed on both sides of the transfer and compared.

Every element a rank's engine receives is put on the wire (or copied locally) by exactly one sender (``plan.py``).
Each sender fingerprints the pieces it serves, per destination rank and parameter — *before* the transport — and the
receiver fingerprints what it hands to its engine, *after* it. One ``all_reduce`` of the senders' ``[world, params]``
matrix gives every rank the sum of what was sent to it; the fingerprint is additive over pieces, so that sum equals
the receiver's fingerprint exactly when every piece arrived intact and in its place. A mismatch names the parameter
and the rank (:class:`WeightSyncMismatch`).

The fingerprint of a region of a tensor (in the wire dtype) is row-positional and integer, so it is exact whatever
the order of summation: ``Σ_r (r + 1) · rowbits_r`` over the region's global rows ``r`` (dim 0), where ``rowbits_r``
is the wrapping int32 sum of the row's bytes read as int32 words (int16 words when a row has an odd number of 2-byte
elements; a 1-D tensor's "rows" are its elements). Arithmetic wraps modulo 2⁶⁴ (int64) on both sides alike. Row
sums of int32 words run at memory speed — a fraction of the copy the transfer itself makes
(``benchmarks/weight_sync.py`` prints the share).

What it proves: the bytes each engine rank was handed equal the trainer's, region by region. It does not read the
engine's parameters back (vLLM repacks them on CPU); the per-step log-prob gate covers the load itself, and the
worker's weight version (``ActorRolloutRefWorker``) catches a sync that did not run.
"""

from __future__ import annotations

from typing import Iterable, Iterator, Optional, Sequence

import torch
import torch.distributed as dist

from hybridrl.hybrid_engine.plan import box_slices
from hybridrl.hybrid_engine.tp_rules import Box


class WeightSyncMismatch(RuntimeError):
    """A rank's engine was handed weights that differ from what the trainer sent; names the parameters."""


def _row_words(piece: torch.Tensor) -> torch.Tensor:
    """``[rows, words]`` integer view of a piece: int32 words when each row's bytes allow, else int16 (else bytes).
    A piece whose rows are each contiguous (a column slice of a matrix) is viewed in place, without a copy."""
    if piece.dim() > 1:
        rows, row_bytes = piece.shape[0], piece[0].numel() * piece.element_size()
    else:  # a 1-D tensor's rows are its elements
        rows, row_bytes = piece.numel(), piece.element_size()
    word = 4 if row_bytes % 4 == 0 else 2 if row_bytes % 2 == 0 else 1
    dtype = {4: torch.int32, 2: torch.int16, 1: torch.uint8}[word]
    if not piece.is_contiguous():
        strided = _strided_words(piece, rows, row_bytes, word, dtype)
        if strided is not None:
            return strided
        piece = piece.contiguous()
    flat = piece.reshape(rows, -1) if piece.dim() > 1 else piece.reshape(-1, 1)
    return flat.view(torch.uint8).view(dtype)


def _strided_words(piece: torch.Tensor, rows: int, row_bytes: int, word: int,
                   dtype: torch.dtype) -> Optional[torch.Tensor]:
    """The words of a piece whose every row is one contiguous run (rows ``stride(0)`` apart), as a strided view of
    its storage; ``None`` when its rows are not contiguous runs or not aligned to ``word`` bytes."""
    if piece.dim() < 2 or not piece[0].is_contiguous():
        return None
    size = piece.element_size()
    offset, stride = piece.storage_offset() * size, piece.stride(0) * size
    if offset % word or stride % word:
        return None
    return torch.empty(0, dtype=dtype, device=piece.device).set_(
        piece.untyped_storage(), offset // word, (rows, row_bytes // word), (stride // word, 1))


def region_fingerprint(piece: torch.Tensor, region: Box) -> torch.Tensor:
    """The fingerprint of ``piece``, the contents of full-tensor ``region`` (see the module docstring): a 0-d int64
    tensor on ``piece``'s device, so a sync's fingerprints add up there without a host round trip per piece."""
    if piece.numel() == 0:
        return torch.zeros((), dtype=torch.int64, device=piece.device)
    words = _row_words(piece)
    row_sums = words.sum(dim=1, dtype=torch.int32 if words.dtype == torch.int32 else torch.int64).to(torch.int64)
    first_row = region[0][0] if region else 0
    weights = torch.arange(first_row + 1, first_row + 1 + row_sums.shape[0], dtype=torch.int64,
                           device=row_sums.device)
    return (row_sums * weights).sum()


class SyncChecksums:
    """The fingerprints of one sync on one rank: ``expected[dst, p]`` (this rank's contributions as a sender) and
    ``observed[p]`` (what this rank's engine was handed), for the plan's ``names`` in order. Both live on ``device``
    (where the transfer's buffers are: the GPU under NCCL), read back once, in :meth:`verify`."""

    def __init__(self, names: Sequence[str], world_size: int, device: Optional[torch.device] = None) -> None:
        self.names = list(names)
        self.index = {name: position for position, name in enumerate(self.names)}
        device = device or torch.device("cpu")
        self.expected = torch.zeros(world_size, len(self.names), dtype=torch.int64, device=device)
        self.observed = torch.zeros(len(self.names), dtype=torch.int64, device=device)
        self.seen = torch.zeros(len(self.names), dtype=torch.bool)

    def sent(self, dst_rank: int, name: str, piece: torch.Tensor, region: Box) -> None:
        """A sender served ``piece`` (the contents of ``region``) of parameter ``name`` to ``dst_rank``."""
        self.sent_to([dst_rank], name, piece, region)

    def sent_to(self, dst_ranks: Sequence[int], name: str, piece: torch.Tensor, region: Box) -> None:
        """A sender served the same ``piece`` of ``name`` to each of ``dst_ranks`` (fingerprinted once)."""
        fingerprint = region_fingerprint(piece, region).to(self.expected.device)
        self.expected[list(dst_ranks), self.index[name]] += fingerprint

    def sent_to_every(self, name: str, piece: torch.Tensor, region: Box) -> None:
        """A sender's ``piece`` of ``name`` goes to every rank (an all-gather)."""
        self.sent_to(range(self.expected.shape[0]), name, piece, region)

    def observe(self, stream: Iterable[tuple[str, torch.Tensor]], regions: dict[str, Box],
                full_shaped: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
        """Pass ``stream`` through, fingerprinting each ``(name, slice)`` — ``regions[name]`` is where the slice
        sits in the full tensor. ``full_shaped``: the stream yields full tensors and only ``regions[name]`` of each
        is this rank's (the shared-memory transport)."""
        for name, piece in stream:
            position = self.index[name]
            mine = piece[box_slices(regions[name])] if full_shaped else piece
            self.observed[position] += region_fingerprint(mine, regions[name]).to(self.observed.device)
            self.seen[position] = True
            yield name, piece

    def verify(self, rank: int, group: Optional[dist.ProcessGroup] = None) -> None:
        """Sum the senders' fingerprints (collective: every rank of ``group`` calls it) and compare with what this
        rank observed; :class:`WeightSyncMismatch` naming the parameters that differ or never arrived."""
        expected = self.expected.clone()
        if dist.is_initialized() and dist.get_world_size(group) > 1:
            dist.all_reduce(expected, group=group)
        self.compare(expected[rank], rank)

    def compare(self, expected: torch.Tensor, rank: int) -> None:
        """Compare what this rank observed with ``expected[p]`` (the senders' fingerprints for it, summed);
        :class:`WeightSyncMismatch` naming the parameters that differ or never arrived."""
        missing = [name for name, seen in zip(self.names, self.seen.tolist()) if not seen]
        differ = [name for name, want, got in zip(self.names, expected.tolist(), self.observed.tolist())
                  if want != got and name not in missing]
        if missing or differ:
            parts = [f"{len(differ)} parameter(s) arrived different from what was sent: {_listed(differ)}"] if differ \
                else []
            parts += [f"{len(missing)} never arrived: {_listed(missing)}"] if missing else []
            raise WeightSyncMismatch(f"weight sync check failed on rank {rank}: {'; '.join(parts)}. The engine's "
                                     "weights are not the trainer's; the run stops rather than train on samples "
                                     "from them (rollout.verify_weight_sync)")


def _listed(names: list[str], shown: int = 5) -> str:
    return ", ".join(names[:shown]) + (" …" if len(names) > shown else "")
