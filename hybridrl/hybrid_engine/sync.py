"""The worker-facing API: stream an FSDP2 model's weights in this rank's generation (rollout) layout.

A colocated worker builds one ``WeightResharder`` after sharding its model (the plan and buckets depend only on
shapes) and, at every weight sync, hands its stream to the engine::

    resharder = WeightResharder(model, tp_size=rollout.tensor_model_parallel_size,
                                bucket_bytes=bucket_bytes_from_mb(rollout.weight_sync_bucket_mb),
                                dtype=torch.bfloat16)
    engine.update_weights(resharder.stream())     # (hf_name, this rank's TP slice) pairs, bucket by bucket
    resharder.last_stats                           # bytes moved, peak buffer bytes, seconds

Every rank of the FSDP group must drain its stream (the buckets' communication is issued as the stream advances).
"""

from __future__ import annotations

import logging
from typing import Iterator, Optional, Protocol

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor, Shard

from hybridrl.hybrid_engine.buckets import bucket_bound, gather_footprint, p2p_footprint, pack_buckets
from hybridrl.hybrid_engine.checksums import SyncChecksums
from hybridrl.hybrid_engine.plan import GenerationLayout, ParamMeta, ReshardPlan, box_slices, build_plan
from hybridrl.hybrid_engine.shared_memory import SharedArena, SharedMemoryUnavailable, arena_offsets, stream_shared
from hybridrl.hybrid_engine.checkpoint_names import engine_rule
from hybridrl.hybrid_engine.tp_rules import RuleFn
from hybridrl.hybrid_engine.transfer import TransferStats, default_device, stream_gathered, stream_plan

logger = logging.getLogger(__name__)

METHODS = ("auto", "plan", "gather", "shared")


def param_metas(model: nn.Module) -> list[ParamMeta]:
    """Name, full shape and dtype of every parameter (a ``DTensor``'s shape is already the full shape)."""
    return [ParamMeta(name, tuple(param.shape), param.dtype) for name, param in model.named_parameters()]


def local_shards(model: nn.Module, world_size: int) -> dict[str, torch.Tensor]:
    """``{hf_name: this rank's FSDP2 row shard}``; ``ValueError`` unless every parameter is ``Shard(0)`` over
    ``world_size`` ranks (a plain tensor is accepted only when ``world_size == 1``)."""
    shards = {}
    for name, param in model.named_parameters():
        if isinstance(param, DTensor):
            if tuple(param.placements) != (Shard(0),) or param.device_mesh.size() != world_size:
                raise ValueError(f"parameter {name!r} is a DTensor with placements {param.placements} on a mesh of "
                                 f"{param.device_mesh.size()} ranks; resharding expects FSDP2 Shard(0) over "
                                 f"{world_size} ranks")
            shards[name] = param.to_local().detach()
        elif world_size == 1:
            shards[name] = param.detach()
        else:
            raise ValueError(f"parameter {name!r} is not FSDP2-sharded (a plain tensor on a {world_size}-rank group); "
                             f"shard the model with fully_shard, and call model.reshard() if it was left unsharded")
    return shards


class WeightSource(Protocol):
    """What the engine receives instead of the model's own parameters (e.g. LoRA-merged weights under HF names):
    ``metas()`` lists them in order; ``shards(local)`` turns ``local_shards(model)`` into this rank's rows of each."""

    def metas(self) -> list[ParamMeta]: ...

    def shards(self, local: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]: ...


def _group_rank_and_size(group: Optional[dist.ProcessGroup]) -> tuple[int, int]:
    if not dist.is_initialized():
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


class WeightResharder:
    """Plan once, stream at every sync: an FSDP2 model's weights into this rank's rollout layout.

    Args:
        model: the FSDP2-sharded HF model (``Shard(0)`` DTensor parameters over ``group``).
        tp_size: generation tensor-parallel size ``t_g`` (must divide the group size ``N``).
        bucket_bytes: bound on the executor's live buffers per rank (``rollout.weight_sync_bucket_mb`` in bytes);
            a single parameter larger than that is moved alone.
        dtype: the engine's dtype (cast on the sender); default the master dtype.
        group: the FSDP process group (default: the world).
        order: ``"dp_major"`` (the ``[dp, tp]`` rollout mesh of ``build_device_meshes``) or ``"tp_major"``
            (HybridFlow's grouping, less traffic); must match how the engine's TP groups were formed.
        rule: TP split rule (default :func:`~hybridrl.hybrid_engine.checkpoint_names.engine_rule`: slices where
            vetted, else whole tensors).
        method: ``"plan"`` (point-to-point, any ``t_g``), ``"gather"`` (all-gather, ``t_g = 1`` only),
            ``"shared"`` (host shared memory, one-host CPU groups: ``shared_memory.py``) or ``"auto"``: ``"shared"``
            when the buffers are on CPU, the group has several ranks and they can map one host buffer, else
            ``"plan"`` (on gloo the plan path measured 2× faster than ``"gather"``, and ``"shared"`` 4–8× faster
            than ``"plan"``: ``benchmarks/weight_sync.py``); ``"gather"`` stays for backends whose all-gather is
            the fastest primitive (NCCL) — measure before switching. Constructing with ``"shared"``/``"auto"`` is
            collective (every rank of ``group`` maps the buffer).
        source: a ``WeightSource`` deriving the engine's weights from the model's shards (default: the parameters
            as they are); ``hybridrl.hybrid_engine.lora_weights.MergedLoraWeights`` sends LoRA-merged weights.
    """

    def __init__(self, model: nn.Module, *, tp_size: int, bucket_bytes: int, dtype: Optional[torch.dtype] = None,
                 group: Optional[dist.ProcessGroup] = None, order: str = "dp_major", rule: Optional[RuleFn] = None,
                 method: str = "auto", device: Optional[torch.device] = None,
                 source: Optional[WeightSource] = None) -> None:
        if method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {method!r}")
        if method == "gather" and tp_size != 1:
            raise ValueError(f"method='gather' delivers full tensors and needs tp_size=1, got tp_size={tp_size}")
        self.model, self.group, self.device, self.source = model, group, device, source
        self.rank, world_size = _group_rank_and_size(group)
        rule = rule or engine_rule(model, tp_size)
        metas = source.metas() if source is not None else param_metas(model)
        self.plan: ReshardPlan = build_plan(metas, GenerationLayout(world_size, tp_size, order),
                                            rule, dtype)
        self.arena: Optional[SharedArena] = None
        self.method = self._resolve_method(method)
        footprint = p2p_footprint(self.plan) if self.method == "plan" else gather_footprint(self.plan)
        self.buckets = pack_buckets(self.plan, bucket_bytes, footprint)
        self.buffer_bound_bytes = (self.arena.nbytes if self.arena is not None
                                   else bucket_bound(self.buckets, bucket_bytes))
        self.last_stats = TransferStats()
        self.last_checksums: Optional[SyncChecksums] = None
        self.regions = {param.meta.name: param.dst_regions[self.rank] for param in self.plan.params}

    def _resolve_method(self, method: str) -> str:
        """``auto`` → ``shared`` where it can work (else ``plan``); ``shared`` makes the arena (collective)."""
        on_cpu = (self.device or default_device(self.group)).type == "cpu"
        if method == "auto":
            if not on_cpu or self.plan.world_size == 1:
                return "plan"
            try:
                self._make_arena()
            except SharedMemoryUnavailable as error:
                logger.warning("weight sync over point-to-point messages (about 4x slower than shared memory): %s", error)
                return "plan"
            return "shared"
        if method == "shared":
            if not on_cpu:
                raise ValueError("method='shared' moves host tensors; on a GPU use method='plan' (NCCL)")
            self._make_arena()
        return method

    def _make_arena(self) -> None:
        self.offsets, nbytes = arena_offsets([param.meta.shape for param in self.plan.params], self.plan.wire_dtype)
        self.arena = SharedArena.create(nbytes, self.rank, self.group)

    def close(self) -> None:
        """Unmap the shared-memory arena (if any); the resharder cannot stream after this."""
        self.arena = None

    def stream(self, checked: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
        """``(hf_name, tensor)`` in parameter order: this rank's TP slice (``t_g > 1``) or the full tensor.

        ``checked``: fingerprint what every rank serves before it moves and what this rank yields after
        (``checksums.py``); once the stream is drained, :meth:`verify` compares them. With ``method="shared"``
        a slice is a view into the shared arena, valid until the next sync starts.
        """
        if self.method == "shared":
            return ((name, full[box_slices(self.regions[name])]) for name, full in self._stream_shared(checked))
        executor = stream_gathered if self.method == "gather" else stream_plan
        stream = executor(self.plan, self.buckets, self._begin(checked), self.rank, group=self.group,
                          device=self.device, stats=self.last_stats, checksums=self.last_checksums)
        return self.last_checksums.observe(stream, self.regions) if checked else stream

    def _begin(self, checked: bool) -> dict[str, torch.Tensor]:
        """Fresh stats and checksums for a sync; this rank's shards of what the engine receives."""
        self.last_stats = TransferStats()
        self.last_checksums = (SyncChecksums(list(self.regions), self.plan.world_size,
                                             self.device or default_device(self.group)) if checked else None)
        shards = local_shards(self.model, self.plan.world_size)
        return self.source.shards(shards) if self.source is not None else shards

    def _stream_shared(self, checked: bool) -> Iterator[tuple[str, torch.Tensor]]:
        """Full-tensor views into the arena (this rank's engine reads its region of each)."""
        if self.arena is None:
            raise RuntimeError("this WeightResharder was closed")
        stream = stream_shared(self.plan, self.buckets, self._begin(checked), self.rank, self.arena, self.offsets,
                               group=self.group, stats=self.last_stats, checksums=self.last_checksums)
        return self.last_checksums.observe(stream, self.regions, full_shaped=True) if checked else stream

    def verify(self) -> None:
        """After a drained ``stream(checked=True)``: raise ``WeightSyncMismatch`` naming any parameter whose bytes
        differ from what was sent (collective: every rank of the group calls it)."""
        if self.last_checksums is None:
            raise RuntimeError("verify() needs a preceding stream(checked=True)")
        self.last_checksums.verify(self.rank, self.group)

    def stream_full_shaped(self, checked: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
        """:meth:`stream`, each TP slice placed at its region of a full-shaped tensor for loaders that narrow their
        rank's part out of a full checkpoint tensor themselves (vLLM's ``weight_loader``s, fused q/k/v and
        gate/up included). Only the region is written; the rest is uninitialised memory that such a loader never
        reads — ``tp_rules`` mirrors vLLM's narrowing, and the sync's checksums cover exactly the regions sent.
        What moves between ranks is still only the slices (zero redundancy); the full shape is a local buffer."""
        if self.method == "shared":  # the arena holds full tensors already: nothing to place
            yield from self._stream_shared(checked)
            return
        shapes = {param.meta.name: param.meta.shape for param in self.plan.params}
        for name, piece in self.stream(checked):
            if tuple(piece.shape) == shapes[name]:
                yield name, piece
                continue
            full = torch.empty(shapes[name], dtype=piece.dtype, device=piece.device)
            full[box_slices(self.regions[name])] = piece
            yield name, full
