"""Weight sync through host shared memory: every rank of a one-host group maps one buffer of the model's full tensors.

The CPU transport (``method="shared"``). Point-to-point over gloo moves every byte through loopback TCP — a kernel
copy out, a kernel copy in, and one message per box (``benchmarks/weight_sync.py``: 5–6× one memcpy of the model).
When all ranks are on one host there is no wire to cross: each rank casts its FSDP row shard straight into its rows
of the full tensor in a shared buffer (one write of ``M / N`` bytes per rank, in parallel), a barrier publishes the
bucket, and each rank's engine reads exactly its TP region in place. Nothing is sent twice and nothing is staged.

The buffer (an *arena*) holds every parameter's full tensor in the wire dtype, each at a 64-byte-aligned offset: one
copy of the model per host, not per rank, allocated up front with ``posix_fallocate`` (a ``/dev/shm`` too small is
refused when the arena is made, not met later as ``SIGBUS``), mapped by every rank and unlinked at once, so nothing is
left behind whatever way the processes end. It lives as long as the resharder: the yielded tensors are views into it,
valid until the next sync starts — vLLM's CPU reload buffers a layer's pieces until the layer is complete, so a
view must outlive its bucket. Each sync starts with a barrier, so no rank overwrites tensors another rank's engine
is still loading.

Accounting and checks follow the plan (``plan.py``): a rank "receives" the parts of its region that other ranks
wrote and "sends" the parts of its rows that other regions hold, so ``TransferStats`` equal ``plan_traffic`` and a
rank's received + local bytes are exactly its TP slice. With ``checksums``, each writer fingerprints, per reader,
the region it wrote for that reader — before the barrier — and the reader fingerprints its region after.
"""

from __future__ import annotations

import math
import os
import tempfile
import time
import uuid
from typing import Iterator, Mapping, Optional, Sequence

import torch
import torch.distributed as dist

from hybridrl.hybrid_engine.buckets import Bucket
from hybridrl.hybrid_engine.checksums import SyncChecksums
from hybridrl.hybrid_engine.plan import ParamPlan, ReshardPlan, box_slices
from hybridrl.hybrid_engine.tp_rules import Box
from hybridrl.hybrid_engine.transfer import TransferStats, check_local_shards, group_src_rank

ALIGNMENT = 64
SHM_DIR = "/dev/shm"
FILE_PREFIX = "hybridrl-weights-"


class SharedMemoryUnavailable(RuntimeError):
    """The ranks of a group cannot share one host buffer (other hosts, no room in ``/dev/shm``); says why."""


def arena_offsets(shapes: Sequence[Sequence[int]], dtype: torch.dtype) -> tuple[list[int], int]:
    """Byte offset of every full tensor of ``shapes`` (``dtype``, 64-byte aligned) and the arena's total bytes."""
    offsets, cursor = [], 0
    for shape in shapes:
        offsets.append(cursor)
        cursor += -(-math.prod(shape) * dtype.itemsize // ALIGNMENT) * ALIGNMENT
    return offsets, max(cursor, ALIGNMENT)


class SharedArena:
    """``nbytes`` of host memory mapped by every rank of ``group``. Collective to create (:meth:`create`)."""

    def __init__(self, storage: torch.Tensor, path: str) -> None:
        self.storage = storage  # uint8 [nbytes], MAP_SHARED
        self.path = path  # the file it was mapped from, unlinked before create() returned

    @property
    def nbytes(self) -> int:
        return self.storage.numel()

    @classmethod
    def create(cls, nbytes: int, rank: int, group: Optional[dist.ProcessGroup] = None,
               directory: Optional[str] = None, keep_file: bool = False) -> "SharedArena":
        """Group rank 0 makes and sizes the file, every rank maps it, then it is unlinked (before any rank
        returns) — unless ``keep_file``: another group will :meth:`attach` it, and rank 0 must :meth:`remove` it
        (a file whose creator died is swept by the next ``create`` in its directory). Raises
        :class:`SharedMemoryUnavailable` on every rank (with rank 0's or the failing rank's reason) when any rank
        cannot map it — so all ranks take the same fallback."""
        directory = directory or (SHM_DIR if os.path.isdir(SHM_DIR) else tempfile.gettempdir())
        path, reason = "", ""
        if rank == 0:
            path, reason = _make_file(directory, nbytes)
        path, reason = _broadcast((path, reason), group)
        storage = None
        if not reason:
            try:
                storage = torch.from_file(path, shared=True, size=nbytes, dtype=torch.uint8)
            except (OSError, RuntimeError) as error:
                reason = f"rank {rank} cannot map {path}: {error} (are all ranks on one host?)"
        reasons = _gather_reasons(reason, group)
        if rank == 0 and path and (any(reasons) or not keep_file):
            os.unlink(path)  # every rank has mapped it (or given up): the memory lives until the last mapping goes
        _barrier(group)
        if any(reasons):
            raise SharedMemoryUnavailable(next(r for r in reasons if r))
        return cls(storage, path)

    @classmethod
    def attach(cls, path: str, nbytes: int) -> "SharedArena":
        """Map an arena another group created with ``keep_file=True`` (:class:`SharedMemoryUnavailable` if absent:
        this process is on another host, or the creator is gone)."""
        if not os.path.exists(path):
            raise SharedMemoryUnavailable(f"the weights arena {path} is not visible here: the rollout pool must be "
                                          "on the trainer's host (rollout.n_gpus on one node)")
        return cls(torch.from_file(path, shared=True, size=nbytes, dtype=torch.uint8), path)

    def remove(self) -> None:
        """Delete a kept file (its memory lives on while anyone maps it)."""
        if self.path and os.path.exists(self.path):
            os.unlink(self.path)

    def view(self, offset: int, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        """The tensor of ``shape`` / ``dtype`` stored at byte ``offset``."""
        nbytes = math.prod(shape) * dtype.itemsize
        return self.storage[offset:offset + nbytes].view(dtype).view(tuple(shape))


def _make_file(directory: str, nbytes: int) -> tuple[str, str]:
    """Create and allocate the arena's file; ``(path, "")`` or ``("", why not)``."""
    _sweep_orphans(directory)
    path = os.path.join(directory, f"{FILE_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:12]}")
    try:
        descriptor = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    except OSError as error:
        return "", f"cannot create {path}: {error}"
    try:
        os.posix_fallocate(descriptor, 0, nbytes)
    except OSError as error:
        os.unlink(path)
        return "", (f"{directory} cannot hold {nbytes / 2**20:.0f} MiB of weights ({error}); enlarge it "
                    f"(docker: --shm-size) or set rollout.weight_transfer=plan")
    finally:
        os.close(descriptor)
    return path, ""


def _sweep_orphans(directory: str) -> None:
    """Remove kept arena files whose creating process no longer exists (a run that was killed)."""
    for name in os.listdir(directory):
        if not name.startswith(FILE_PREFIX):
            continue
        pid = name[len(FILE_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            try:
                os.unlink(os.path.join(directory, name))
            except OSError:
                pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _broadcast(value: tuple[str, str], group: Optional[dist.ProcessGroup]) -> tuple[str, str]:
    if not dist.is_initialized() or dist.get_world_size(group) == 1:
        return value
    holder = [value]
    dist.broadcast_object_list(holder, src=group_src_rank(group), group=group)
    return holder[0]


def _gather_reasons(reason: str, group: Optional[dist.ProcessGroup]) -> list[str]:
    if not dist.is_initialized() or dist.get_world_size(group) == 1:
        return [reason]
    reasons: list[str] = [""] * dist.get_world_size(group)
    dist.all_gather_object(reasons, reason, group=group)
    return reasons


def _barrier(group: Optional[dist.ProcessGroup]) -> None:
    if dist.is_initialized() and dist.get_world_size(group) > 1:
        dist.barrier(group=group)


def stream_shared(plan: ReshardPlan, buckets: Sequence[Bucket], local_shards: Mapping[str, torch.Tensor], rank: int,
                  arena: SharedArena, offsets: Sequence[int], *, group: Optional[dist.ProcessGroup] = None,
                  stats: Optional[TransferStats] = None,
                  checksums: Optional[SyncChecksums] = None) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(hf_name, full tensor view)`` for every parameter: the arena's copy, whose rows every rank wrote.
    This rank's engine must read only its region (``plan.params[i].dst_regions[rank]``); views stay valid until
    the next sync. Every rank of ``group`` must drain the stream (one barrier per bucket, one before the first)."""
    check_local_shards(plan, rank, local_shards)
    stats = stats if stats is not None else TransferStats()
    started = time.perf_counter()
    _barrier(group)  # every engine has finished loading the previous sync's views
    stats.seconds += time.perf_counter() - started
    for bucket in buckets:
        started = time.perf_counter()
        outputs = []
        for index in bucket.param_indices:
            param = plan.params[index]
            full = arena.view(offsets[index], param.meta.shape, plan.wire_dtype)
            _write_own_rows(param, full, local_shards[param.meta.name], rank, stats, checksums)
            outputs.append((param.meta.name, full))
        _barrier(group)  # the bucket is complete in the arena
        stats.num_buckets += 1
        stats.peak_buffer_bytes = arena.nbytes
        stats.seconds += time.perf_counter() - started
        yield from outputs


def _write_own_rows(param: ParamPlan, full: torch.Tensor, local: torch.Tensor, rank: int, stats: TransferStats,
                    checksums: Optional[SyncChecksums]) -> None:
    """Cast this rank's FSDP rows into the arena's full tensor; count (and fingerprint) what each reader gets."""
    start, stop = param.src_rows[rank]
    if stop > start:
        full[start:stop].copy_(local)
    readers: dict[Box, list[int]] = {}
    for transfer in param.transfers:
        if transfer.dst_rank == rank:
            if transfer.is_local:
                stats.local_bytes += transfer.nbytes
            else:
                stats.received_bytes += transfer.nbytes
        if transfer.src_rank == rank:
            stats.sent_bytes += 0 if transfer.is_local else transfer.nbytes
            readers.setdefault(transfer.region, []).append(transfer.dst_rank)
    if checksums is not None:
        for region, dst_ranks in readers.items():
            checksums.sent_to(dst_ranks, param.meta.name, full[box_slices(region)], region)
