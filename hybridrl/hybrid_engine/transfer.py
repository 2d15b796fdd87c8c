"""Execute a resharding plan over a process group, bucket by bucket, as a stream of ``(hf_name, tensor)`` pairs.

Two executors, both generators that every rank of the group must drain completely (each bucket's communication is
issued when the generator reaches it, and ranks must reach the same buckets):

* ``stream_plan`` — the zero-redundancy plan path (any ``t_g``): per bucket, each rank posts one ``isend`` per box
  it serves and one ``irecv`` per box it needs, straight into its output slice (``batch_isend_irecv``; gloo on CPU,
  NCCL on GPU). Point-to-point needs no global call, so a rank with nothing to send or receive in a bucket simply
  posts nothing — uneven plans cannot deadlock. Messages are tagged by their position in the bucket's transfer list,
  which every rank enumerates identically.
* ``stream_gathered`` — the ``t_g = 1`` path: one in-place ``all_gather_into_tensor`` per parameter into a buffer
  padded to whole FSDP chunks; the yielded tensor is a view of its first ``R`` rows.

Casting happens on the sender (fp32 master → bf16 engine halves the bytes on the wire). Yielded tensors are
``[slice rows, ...]`` in the plan's ``wire_dtype`` on ``device``, freshly allocated per sync (never reused), so a
consumer may keep them; the memory bound (one bucket, see ``buckets.py``) holds when it copies them into its own
weights and lets go, as ``update_weights`` does. The executor drops its references before the next bucket.

On NCCL, ``batch_isend_irecv`` needs ``torch.cuda.set_device`` (``utils.distributed.init_process_group`` does it)
and an existing communicator for a partial-participation batch; FSDP2's all-gathers create it before any sync.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field
from typing import Iterator, Mapping, Optional, Sequence

import torch
import torch.distributed as dist

from hybridrl.hybrid_engine.buckets import Bucket
from hybridrl.hybrid_engine.checksums import SyncChecksums
from hybridrl.hybrid_engine.plan import ParamPlan, ReshardPlan, box_slices
from hybridrl.hybrid_engine.tp_rules import Box, full_box

NamedTensors = Iterator[tuple[str, torch.Tensor]]


@dataclass
class TransferStats:
    """What one stream moved on this rank (bytes of the wire dtype) and the most executor memory live at once."""

    sent_bytes: int = 0
    received_bytes: int = 0
    local_bytes: int = 0
    peak_buffer_bytes: int = 0
    num_buckets: int = 0
    num_messages: int = 0
    seconds: float = 0.0


@dataclass
class BufferTracker:
    """Counts the storage bytes of buffers the executor allocates itself (outputs, staging copies), live and peak."""

    live_bytes: int = 0
    peak_bytes: int = 0
    _held: list[torch.Tensor] = field(default_factory=list)

    def new(self, shape: Sequence[int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        tensor = torch.empty(tuple(shape), dtype=dtype, device=device)
        self._held.append(tensor)
        self.live_bytes += tensor.untyped_storage().nbytes()
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        return tensor

    def release(self, tensors: Sequence[torch.Tensor]) -> None:
        """Forget ``tensors`` (staging after its sends completed; outputs after they were yielded)."""
        ids = {id(tensor) for tensor in tensors}
        kept = []
        for tensor in self._held:
            if id(tensor) in ids:
                self.live_bytes -= tensor.untyped_storage().nbytes()
            else:
                kept.append(tensor)
        self._held = kept

    def release_all(self) -> None:
        """Forget every buffer (end of a bucket: its outputs were yielded and are the consumer's now)."""
        self._held, self.live_bytes = [], 0


def default_device(group: Optional[dist.ProcessGroup] = None) -> torch.device:
    """Where transfer buffers live: the current CUDA device under NCCL, else CPU."""
    if dist.is_initialized() and "nccl" in str(dist.get_backend(group)).lower() and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _global_rank(group: Optional[dist.ProcessGroup], group_rank: int) -> int:
    return group_rank if group is None else dist.get_global_rank(group, group_rank)


def group_src_rank(group: Optional[dist.ProcessGroup]) -> int:
    """The global rank of ``group``'s rank 0 (what ``src=`` of a broadcast over ``group`` takes)."""
    return _global_rank(group, 0)


def check_local_shards(plan: ReshardPlan, rank: int, local_shards: Mapping[str, torch.Tensor]) -> None:
    """``ValueError`` if a local shard is missing or its rows differ from the plan's FSDP ``Shard(0)`` chunk."""
    for param in plan.params:
        name = param.meta.name
        if name not in local_shards:
            raise ValueError(f"local shard of parameter {name!r} is missing")
        start, stop = param.src_rows[rank]
        expected = (stop - start, *param.meta.shape[1:])
        if tuple(local_shards[name].shape) != expected:
            raise ValueError(f"local shard of {name!r} on rank {rank} has shape {tuple(local_shards[name].shape)}, "
                             f"the plan expects {expected} (FSDP2 Shard(0) rows {start}:{stop})")


def stream_plan(plan: ReshardPlan, buckets: Sequence[Bucket], local_shards: Mapping[str, torch.Tensor], rank: int,
                *, group: Optional[dist.ProcessGroup] = None, device: Optional[torch.device] = None,
                stats: Optional[TransferStats] = None, checksums: Optional[SyncChecksums] = None) -> NamedTensors:
    """Yield ``(hf_name, this rank's generation slice)`` for every parameter, executing ``plan`` bucket by bucket.

    Args:
        local_shards: ``{hf_name: this rank's FSDP row shard [rows_r, ...]}`` (``DTensor.to_local()``), any dtype.
        rank: this process's rank in ``group`` (the plan's rank numbering).
        stats: filled in as the stream advances (bytes, peak buffer bytes, seconds).
        checksums: if given, every piece this rank serves is fingerprinted for its destination before it moves.
    """
    check_local_shards(plan, rank, local_shards)
    device = device or default_device(group)
    stats = stats if stats is not None else TransferStats()
    tracker = BufferTracker()
    for bucket in buckets:
        started = time.perf_counter()
        outputs, staging, ops = _post_bucket(plan, bucket, local_shards, rank, group, device, tracker, stats,
                                             checksums)
        works = dist.batch_isend_irecv(ops) if ops else []
        for work in works:
            work.wait()
        del works, ops  # with `staging`, the last references to the send buffers: free them before yielding
        tracker.release(staging)
        staging.clear()
        stats.num_buckets += 1
        stats.peak_buffer_bytes = tracker.peak_bytes
        stats.seconds += time.perf_counter() - started
        yield from outputs
        tracker.release_all()
        del outputs  # before the next bucket allocates, so real memory matches the tracker's count


def _post_bucket(plan: ReshardPlan, bucket: Bucket, local_shards: Mapping[str, torch.Tensor], rank: int,
                 group: Optional[dist.ProcessGroup], device: torch.device, tracker: BufferTracker,
                 stats: TransferStats, checksums: Optional[SyncChecksums],
                 ) -> tuple[list[tuple[str, torch.Tensor]], list[torch.Tensor], list[dist.P2POp]]:
    """Allocate the bucket's outputs, do its local copies, and build (not yet start) its send/recv ops."""
    outputs, staging, ops = [], [], []
    first_tag = 0
    for index in bucket.param_indices:
        param = plan.params[index]
        out = tracker.new(param.slice_shape(rank), plan.wire_dtype, device)
        outputs.append((param.meta.name, out))
        ops += _post_param(param, out, local_shards[param.meta.name], rank, first_tag, group, tracker, staging, stats,
                           checksums)
        first_tag += len(param.transfers)
    stats.num_messages += len(ops)
    return outputs, staging, ops


def _post_param(param: ParamPlan, out: torch.Tensor, local: torch.Tensor, rank: int, first_tag: int,
                group: Optional[dist.ProcessGroup], tracker: BufferTracker, staging: list[torch.Tensor],
                stats: TransferStats, checksums: Optional[SyncChecksums] = None) -> list[dist.P2POp]:
    """Local copies of one parameter into ``out``, then its ops; a region this rank already copied into ``out`` is
    sent from there (no second cast, no staging buffer). Tags number the parameter's transfers from ``first_tag``.
    With ``checksums``, each piece this rank serves is fingerprinted for its destination as it is posted."""
    sources: dict[Box, torch.Tensor] = {}  # full-tensor region -> contiguous wire-dtype tensor holding it
    for transfer in param.transfers:
        if transfer.is_local and transfer.src_rank == rank:
            view = out[box_slices(transfer.dst_box)]
            view.copy_(local[box_slices(transfer.src_box)])
            sources[transfer.region] = view
            stats.local_bytes += transfer.nbytes
            if checksums is not None:
                checksums.sent(rank, param.meta.name, view, transfer.region)
    ops = []
    for tag, transfer in enumerate(param.transfers, start=first_tag):
        if transfer.is_local:
            continue
        if transfer.src_rank == rank:
            if transfer.region not in sources:
                sources[transfer.region] = _send_buffer(local, transfer.src_box, out.dtype, out.device, tracker,
                                                        staging)
            ops.append(dist.P2POp(dist.isend, sources[transfer.region], _global_rank(group, transfer.dst_rank),
                                  group, tag))
            if checksums is not None:
                checksums.sent(transfer.dst_rank, param.meta.name, sources[transfer.region], transfer.region)
            stats.sent_bytes += transfer.nbytes
        elif transfer.dst_rank == rank:
            view = out[box_slices(transfer.dst_box)]
            assert view.is_contiguous(), "a destination box must be a contiguous run of rows of its slice"
            ops.append(dist.P2POp(dist.irecv, view, _global_rank(group, transfer.src_rank), group, tag))
            stats.received_bytes += transfer.nbytes
    return ops


def _send_buffer(local: torch.Tensor, box: Box, wire_dtype: torch.dtype, device: torch.device,
                 tracker: BufferTracker, staging: list[torch.Tensor]) -> torch.Tensor:
    """The box of the local shard, ready to send: a view when already contiguous in the wire dtype, else a copy."""
    piece = local[box_slices(box)]
    if piece.dtype == wire_dtype and piece.is_contiguous() and piece.device == device:
        return piece
    buffer = tracker.new(piece.shape, wire_dtype, device)
    buffer.copy_(piece)
    staging.append(buffer)
    return buffer


def stream_gathered(plan: ReshardPlan, buckets: Sequence[Bucket], local_shards: Mapping[str, torch.Tensor], rank: int,
                    *, group: Optional[dist.ProcessGroup] = None, device: Optional[torch.device] = None,
                    stats: Optional[TransferStats] = None, checksums: Optional[SyncChecksums] = None) -> NamedTensors:
    """Yield ``(hf_name, full tensor)`` for every parameter (the ``t_g = 1`` layout) via bucketed all-gathers.

    Per parameter of ``R`` rows the buffer is ``[N·ceil(R/N), ...]``: this rank casts its shard into its own chunk,
    ``all_gather_into_tensor`` fills the others in place, and ``buffer[:R]`` is yielded — no second copy. The
    all-gathers of one bucket are issued asynchronously and awaited together. Byte counts are the logical
    ``(N−1)·chunk`` per parameter (padding included), whatever algorithm the backend runs. With ``checksums``
    each rank fingerprints its own chunk, which every rank receives.
    """
    if plan.layout.tp_size != 1:
        raise ValueError(f"stream_gathered delivers full tensors (t_g=1); the plan has t_g={plan.layout.tp_size}")
    check_local_shards(plan, rank, local_shards)
    device = device or default_device(group)
    stats = stats if stats is not None else TransferStats()
    tracker, n = BufferTracker(), plan.world_size
    for bucket in buckets:
        started = time.perf_counter()
        outputs, works = [], []
        for index in bucket.param_indices:
            param = plan.params[index]
            gathered = _gather_param(param, local_shards[param.meta.name], plan.wire_dtype, rank, n, group, device,
                                     tracker, stats, works)
            if checksums is not None:
                own_rows = param.src_rows[rank]
                own = gathered[own_rows[0]:own_rows[1]]  # this rank's chunk, cast, before the all-gather ran
                checksums.sent_to_every(param.meta.name, own, (own_rows, *full_box(param.meta.shape)[1:]))
            outputs.append((param.meta.name, gathered))
        for work in works:
            work.wait()
        del works
        stats.num_buckets += 1
        stats.peak_buffer_bytes = tracker.peak_bytes
        stats.seconds += time.perf_counter() - started
        yield from outputs
        tracker.release_all()
        del outputs


def _gather_param(param: ParamPlan, local: torch.Tensor, wire_dtype: torch.dtype, rank: int, n: int,
                  group: Optional[dist.ProcessGroup], device: torch.device, tracker: BufferTracker,
                  stats: TransferStats, works: list) -> torch.Tensor:
    """Start the all-gather of one parameter into a fresh padded buffer; return its ``[:R]`` view."""
    rows = param.meta.shape[0]
    chunk = -(-rows // n)
    buffer = tracker.new((chunk * n, *param.meta.shape[1:]), wire_dtype, device)
    own = buffer[rank * chunk:(rank + 1) * chunk]
    own[:local.shape[0]].copy_(local)
    stats.local_bytes += local.numel() * buffer.element_size()
    if n > 1:
        with warnings.catch_warnings():  # torch 2.13 renames it all_gather_single; the old name works on >= 2.6
            warnings.simplefilter("ignore", FutureWarning)
            works.append(dist.all_gather_into_tensor(buffer, own, group=group, async_op=True))
        stats.received_bytes += (n - 1) * own.numel() * buffer.element_size()
        stats.sent_bytes += (n - 1) * own.numel() * buffer.element_size()
        stats.num_messages += 1
    return buffer[:rows]
