"""Weights published by one worker group for another: the trainer's FSDP ranks write, a standalone rollout pool reads.

Split placement (``rollout.n_gpus > 0``) runs the rollout engines in their own worker group, with their own process
group, so the colocated resharding plan (one group, point-to-point) does not apply. On one host the hand-over is the
shared-memory method of ``shared_memory.py`` across groups:

1. the trainer's ranks make one arena (the model's full tensors in the engine dtype; the file is kept so the other
   group can map it) — :class:`WeightPublisher`;
2. after each update, every trainer rank casts its FSDP rows into it (:meth:`WeightPublisher.publish`), and with
   the check on, fingerprints, for each TP rank ``j`` of the rollout layout, the part of its rows that ``j`` reads;
3. the controller sums those fingerprints over the trainer's ranks and hands them with the load call to the rollout
   ranks, which stream full-tensor views into their engines (vLLM narrows each rank's slices) and compare their own
   regions' fingerprints (:class:`PublishedWeights`).

The controller's call order is the synchronisation: a publish starts only after the previous load returned on every
rollout rank, and a load only after the publish returned on every trainer rank.

Across hosts (``rollout.weight_transfer=object_store``) the arena is replaced by Ray's object store: each trainer
rank casts its rows of every parameter into one flat buffer and puts it there (:meth:`WeightPublisher.publish`
returns the reference), the controller hands the ranks' references to the replicas with the load call, and each
rollout rank fetches them — over the network when it is on another node — and assembles each full tensor from the
ranks' rows, one parameter at a time (:meth:`PublishedWeights.stream`). With ``collective`` the same buffers travel
over a process group of the trainer's ranks and each replica's ranks instead (``channel.py``: gloo on CPU, NCCL on
GPU; one point-to-point message per trainer rank and replica rank). The fingerprints are the same every way.

With ``rollout.weight_delta`` both carry each rank's buffer as a delta against the version the replicas hold
(``delta.py``): the changed values with their positions, the whole buffer at the first version and every N; each
rollout rank keeps the buffers it rebuilt, so it needs every publication, in order.
"""

from __future__ import annotations

import json
import logging
import math
import os
import tempfile
import uuid
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional, Sequence

import torch
import torch.distributed as dist
from torch import nn

from hybridrl.hybrid_engine.channel import ChannelAddress, WeightChannel, host_channel
from hybridrl.hybrid_engine.checksums import SyncChecksums
from hybridrl.hybrid_engine.delta import DeltaFrame, DeltaReceiver, DeltaSender
from hybridrl.hybrid_engine.plan import box_numel, box_slices, fsdp_row_ranges
from hybridrl.hybrid_engine.shared_memory import FILE_PREFIX, SHM_DIR, SharedArena, arena_offsets
from hybridrl.hybrid_engine.sync import WeightSource, local_shards, param_metas
from hybridrl.hybrid_engine.checkpoint_names import engine_rule
from hybridrl.hybrid_engine.tp_rules import Box, RuleFn, resolve_split

logger = logging.getLogger(__name__)

TRANSPORTS = ("shared_memory", "object_store", "collective")


@dataclass(frozen=True)
class PublishedLayout:
    """Where the published weights are (picklable; the controller passes it to the readers). ``regions[j][p]``: TP
    rank ``j``'s region of parameter ``p``."""

    path: str
    nbytes: int
    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    offsets: tuple[int, ...]
    dtype: torch.dtype
    tp_size: int
    regions: tuple[tuple[Box, ...], ...]
    transport: str = "shared_memory"
    """``shared_memory`` (``path`` names the arena), ``object_store`` (no arena: each publication's rows travel as
    one object per trainer rank) or ``collective`` (the same buffers over each replica's :class:`WeightChannel`)."""
    writers: int = 1
    """Trainer ranks publishing: each holds the FSDP rows ``fsdp_row_ranges(shape[0], writers)[rank]``."""
    delta: bool = False
    """``object_store`` / ``collective``: each rank's rows travel as a delta against the version the replicas hold
    (``rollout.weight_delta``)."""

    def rows_of(self, writer: int) -> list[tuple[int, int]]:
        """Trainer rank ``writer``'s row range of every parameter."""
        return [fsdp_row_ranges(shape[0], self.writers)[writer] for shape in self.shapes]

    def flat_numel(self, writer: int) -> int:
        """Elements of trainer rank ``writer``'s flat buffer (``object_store`` / ``collective``)."""
        return _flat_offsets(self.shapes, self.rows_of(writer))[1]


@dataclass(frozen=True)
class RankPublication:
    """One trainer rank's publication: its fingerprints ``[tp_size, params]`` (``None``: unchecked) and, with the
    object-store transport, the reference to its rows (kept in a list, so Ray passes the reference itself)."""

    expected: Optional[torch.Tensor]
    rows: tuple = ()


def _flat_offsets(shapes: tuple[tuple[int, ...], ...], rows: list[tuple[int, int]]) -> tuple[list[int], int]:
    """Where each parameter's rows start in a rank's flat buffer (elements), and its length."""
    offsets, total = [], 0
    for shape, (start, stop) in zip(shapes, rows):
        offsets.append(total)
        total += (stop - start) * math.prod(shape[1:])
    return offsets, total


def _intersect_rows(region: Box, rows: tuple[int, int]) -> Optional[Box]:
    start, stop = max(region[0][0], rows[0]), min(region[0][1], rows[1])
    if start >= stop or any(b <= a for a, b in region[1:]):
        return None
    return ((start, stop), *region[1:])


def _frame_arrays(frame: DeltaFrame) -> tuple:
    """``frame`` as numpy arrays of bytes, which Ray's object store holds without a copy."""
    positions = None if frame.positions is None else frame.positions.view(torch.uint8).numpy()
    return frame.kind, frame.version, frame.base_version, frame.numel, frame.values.view(torch.uint8).numpy(), \
        positions


def _frame_from_arrays(arrays: tuple, dtype: torch.dtype) -> DeltaFrame:
    kind, version, base_version, numel, values, positions = arrays
    with warnings.catch_warnings():  # the object store's buffers are read-only, and only read here
        warnings.simplefilter("ignore", UserWarning)
        values = torch.from_numpy(values).view(dtype)
        if positions is not None:
            positions = torch.from_numpy(positions).view(torch.int32 if kind == "indices" else torch.uint8)
    return DeltaFrame(kind, version, base_version, numel, values, positions)


class WeightPublisher:
    """The trainer's side, on every rank of its FSDP group (constructing it is collective).

    Args:
        model: the FSDP2 model (``Shard(0)`` over ``group``).
        tp_size: the rollout pool's tensor-parallel size (which regions each engine rank reads).
        dtype: the engine's dtype (the cast happens on the way in).
        rule / source: as for ``WeightResharder``.
        transport: one of :data:`TRANSPORTS`; channel_timeout_s: ``collective``'s :class:`ChannelAddress` timeout.
        delta_full_every: ``object_store`` / ``collective``: ``> 0`` sends each publication as a delta against the last
            (``delta.py``), whole at least every this many versions; ``0``: always whole.
    """

    def __init__(self, model: nn.Module, *, tp_size: int, dtype: torch.dtype,
                 group: Optional[dist.ProcessGroup] = None, rule: Optional[RuleFn] = None,
                 source: Optional[WeightSource] = None, transport: str = "shared_memory",
                 channel_timeout_s: float = 1800.0, delta_full_every: int = 0) -> None:
        if transport not in TRANSPORTS:
            raise ValueError(f"transport must be one of {TRANSPORTS}, got {transport!r}")
        if delta_full_every and transport == "shared_memory":
            raise ValueError("a delta publication travels through the object store or a collective, not a "
                             "host-shared copy that replicas read in place")
        self.delta = DeltaSender(full_every=delta_full_every) if delta_full_every else None
        self.model, self.group, self.source, self.channel_timeout_s = model, group, source, channel_timeout_s
        self.rank = dist.get_rank(group) if dist.is_initialized() else 0
        self.world_size = dist.get_world_size(group) if dist.is_initialized() else 1
        rule = rule or engine_rule(model, tp_size)
        metas = source.metas() if source is not None else param_metas(model)
        shapes = tuple(meta.shape for meta in metas)
        offsets, nbytes = arena_offsets(shapes, dtype)
        splits = [resolve_split(meta.name, meta.shape, rule(meta.name, meta.shape), tp_size) for meta in metas]
        self.arena = SharedArena.create(nbytes, self.rank, group, keep_file=True) \
            if transport == "shared_memory" else None
        self.layout = PublishedLayout(
            path=self.arena.path if self.arena is not None else "", nbytes=nbytes,
            names=tuple(meta.name for meta in metas), shapes=shapes, offsets=tuple(offsets), dtype=dtype,
            tp_size=tp_size, regions=tuple(tuple(split.boxes[j] for split in splits) for j in range(tp_size)),
            transport=transport, writers=self.world_size, delta=self.delta is not None)
        self.rows = self.layout.rows_of(self.rank)
        self.flat_offsets, self.flat_numel = _flat_offsets(shapes, self.rows)
        self.device = next(model.parameters()).device
        self.channels: dict[int, WeightChannel] = {}  # collective: one per replica, by the replica's index
        self._channel_stores: dict[int, object] = {}  # rank 0: the rendezvous stores it hosts
        self._abandoned: list[WeightChannel] = []  # the channels of replicas that died (their sends stay referenced)

    def host_channel(self, replica: int, readers: int) -> ChannelAddress:
        """Rank 0: host the rendezvous of replica ``replica``'s channel (``readers``: its tensor-parallel ranks)."""
        backend = "nccl" if self.device.type == "cuda" else "gloo"
        self._channel_stores[replica], address = host_channel(self.world_size, readers, backend,
                                                              self.channel_timeout_s)
        return address

    def join_channel(self, replica: int, address: ChannelAddress) -> None:
        """Join replica ``replica``'s channel as writer ``self.rank`` (blocks until its ranks have joined too)."""
        self.channels[replica] = WeightChannel.join(address, self.rank)

    def publish(self, checked: bool, replicas: Optional[Sequence[int]] = None,
                policy_version: int = 0) -> RankPublication:
        """Write this rank's rows of every parameter (into the arena, or into a buffer put into Ray's object store or
        sent over each live replica's channel — ``replicas``: their indices, ``None`` = all — headed by
        ``policy_version``); with ``checked``, also this rank's fingerprints ``[tp_size, params]`` (int64) of what
        each TP rank will read of them (the controller sums them over the ranks)."""
        if self.layout.transport == "collective":  # before a new buffer: the previous one goes first
            self._settle_channels(replicas)
        shards = local_shards(self.model, self.world_size)
        if self.source is not None:
            shards = self.source.shards(shards)
        layout = self.layout
        checks = SyncChecksums(layout.names, layout.tp_size) if checked else None
        flat = None if self.arena is not None else torch.empty(
            self.flat_numel, dtype=layout.dtype, device=self.device if layout.transport == "collective" else "cpu")
        for index, name in enumerate(layout.names):
            start, stop = self.rows[index]
            rows = self._rows_view(index, flat)
            if stop > start:
                rows.copy_(shards[name])
            if checks is not None:
                for tp_rank in range(layout.tp_size):
                    piece = _intersect_rows(layout.regions[tp_rank][index], (start, stop))
                    if piece is not None:
                        local = ((piece[0][0] - start, piece[0][1] - start), *piece[1:])
                        checks.sent(tp_rank, name, rows[box_slices(local)], piece)
        expected = checks.expected if checks is not None else None
        if flat is None:
            return RankPublication(expected)
        frame = self.delta.encode(flat, policy_version) if self.delta is not None else DeltaFrame(
            "full", policy_version, None, flat.numel(), flat)
        if layout.transport == "collective":
            for replica, channel in list(self.channels.items()):
                self._unless_failed(replica, lambda: channel.send(frame))
            return RankPublication(expected)
        import ray

        return RankPublication(expected, (ray.put(_frame_arrays(frame)),))

    def _settle_channels(self, replicas: Optional[Sequence[int]]) -> None:
        """Abandon the channels of replicas no longer live, and wait for the previous publication's sends on the
        others (complete by now: the controller waited for their loads)."""
        if not self.channels:
            raise RuntimeError("rollout.weight_transfer=collective: no live replica's channel is open")
        for replica in list(self.channels):
            if replicas is not None and replica not in replicas:
                self._abandon(replica, "the controller reported it lost")
            else:
                self._unless_failed(replica, self.channels[replica].wait_sent)

    def _unless_failed(self, replica: int, operation) -> None:
        """Run ``operation`` on replica ``replica``'s channel; a transport failure (the replica died unnoticed)
        abandons the channel instead of failing the publication: the replica's load then fails, and the controller
        counts it lost."""
        try:
            operation()
        except RuntimeError as error:
            self._abandon(replica, str(error).splitlines()[0][:200])

    def _abandon(self, replica: int, reason: str) -> None:
        logger.warning("weight channel to rollout replica %d abandoned: %s", replica, reason)
        channel = self.channels.pop(replica)
        channel.abandon()
        self._abandoned.append(channel)  # its sends' buffers stay referenced

    def _rows_view(self, index: int, flat: Optional[torch.Tensor]) -> torch.Tensor:
        """This rank's rows of parameter ``index``: in the arena, or in the flat buffer of this publication."""
        layout, (start, stop) = self.layout, self.rows[index]
        shape = layout.shapes[index]
        if flat is None:
            return self.arena.view(layout.offsets[index], shape, layout.dtype)[start:stop]
        offset = self.flat_offsets[index]
        return flat[offset:offset + (stop - start) * math.prod(shape[1:])].view(stop - start, *shape[1:])

    def close(self) -> None:
        """Rank 0 deletes the arena's file (the readers' mappings stay valid until they let go); the channels are
        shut down."""
        if self.rank == 0 and self.arena is not None:
            self.arena.remove()
        for channel in self.channels.values():
            channel.close()


class PublishedWeights:
    """A rollout rank's side: the arena mapped, streamed into its engine, checked against the trainer's sums."""

    def __init__(self, layout: PublishedLayout, tp_rank: int, rank: int = 0,
                 channel: Optional[WeightChannel] = None) -> None:
        if layout.transport == "collective" and channel is None:
            raise ValueError("rollout.weight_transfer=collective: the replica rank has not joined its channel")
        self.layout, self.tp_rank, self.rank, self.channel = layout, tp_rank, rank, channel
        self.arena = SharedArena.attach(layout.path, layout.nbytes) if layout.transport == "shared_memory" else None
        self.regions = {name: layout.regions[tp_rank][index] for index, name in enumerate(layout.names)}
        self.checks: Optional[SyncChecksums] = None
        self.receivers = [DeltaReceiver() for _ in range(layout.writers)] if layout.delta else []
        self.fetched_bytes = 0
        """Bytes of the last publication fetched from the object store or received over the channel (0 with shared
        memory)."""

    @property
    def delivered_bytes(self) -> int:
        """Bytes of this rank's regions (what its engine reads)."""
        size = self.layout.dtype.itemsize
        return sum(box_numel(region) for region in self.regions.values()) * size

    def stream(self, checked: bool, rows: Sequence = (),
               policy_version: int = 0) -> Iterator[tuple[str, torch.Tensor]]:
        """``(hf_name, full tensor)`` of every parameter (the engine reads its region of each); ``checked``:
        fingerprint this rank's regions for :meth:`verify`. ``rows``: with the object-store transport, the trainer
        ranks' references in rank order (:class:`RankPublication`), fetched here; with ``collective`` the trainer
        ranks' buffers of the publication of ``policy_version`` are received here."""
        layout = self.layout
        self.checks = SyncChecksums(layout.names, layout.tp_size) if checked else None
        if layout.transport == "shared_memory":
            tensors = ((name, self.arena.view(layout.offsets[i], layout.shapes[i], layout.dtype))
                       for i, name in enumerate(layout.names))
        else:
            tensors = self._assembled(self._fetched(rows, policy_version))
        return self.checks.observe(tensors, self.regions, full_shaped=True) if checked else tensors

    def _fetched(self, rows: Sequence, policy_version: int) -> list[torch.Tensor]:
        """The trainer ranks' flat buffers of one publication, in rank order: received over the channel, or fetched
        from the object store (``rows``: their references), and rebuilt from deltas where they are."""
        layout = self.layout
        if layout.transport == "collective":
            frames = self.channel.receive(layout.dtype, policy_version)
        else:
            import ray

            if len(rows) != layout.writers:
                raise ValueError(f"a publication of {layout.writers} trainer ranks came with {len(rows)} row "
                                 "references")
            frames = [_frame_from_arrays(arrays, layout.dtype) for arrays in ray.get(list(rows))]
        self.fetched_bytes = sum(frame.nbytes for frame in frames)
        for writer, frame in enumerate(frames):
            if frame.numel != layout.flat_numel(writer):
                raise ValueError(f"trainer rank {writer} published {frame.numel} values where its rows hold "
                                 f"{layout.flat_numel(writer)}")
        if layout.delta:
            return [receiver.receive(frame) for receiver, frame in zip(self.receivers, frames)]
        if any(frame.kind != "full" for frame in frames):
            raise ValueError("a delta publication reached a replica that expects whole ones (rollout.weight_delta)")
        return [frame.values for frame in frames]

    def _assembled(self, buffers: Sequence[torch.Tensor]) -> Iterator[tuple[str, torch.Tensor]]:
        """Full tensors from the trainer ranks' flat buffers, one at a time."""
        layout = self.layout
        offsets = [_flat_offsets(layout.shapes, layout.rows_of(writer))[0] for writer in range(layout.writers)]
        for index, name in enumerate(layout.names):
            shape, parts = layout.shapes[index], []
            for writer, buffer in enumerate(buffers):
                start, stop = layout.rows_of(writer)[index]
                offset = offsets[writer][index]
                parts.append(buffer[offset:offset + (stop - start) * math.prod(shape[1:])].view(stop - start,
                                                                                                 *shape[1:]))
            yield name, parts[0] if len(parts) == 1 else torch.cat(parts)

    def verify(self, expected: torch.Tensor) -> None:
        """``expected``: the trainer ranks' :meth:`WeightPublisher.publish` results, summed ``[tp_size, params]``;
        ``WeightSyncMismatch`` naming what differs on this rank."""
        if self.checks is None:
            raise RuntimeError("verify() needs a preceding stream(checked=True)")
        self.checks.compare(expected[self.tp_rank], self.rank)


@dataclass(frozen=True)
class Notice:
    """What the arena holds now: the weights of ``policy_version`` (the trainer's count of training steps done when
    they were taken), with the trainer ranks' summed fingerprints (``None``: unchecked)."""

    policy_version: int
    expected: Optional[torch.Tensor]


class PublicationNotice:
    """A small file beside the arena, rewritten by the controller after every publish and polled by rollout ranks
    between engine steps, so that a generation in flight can take new weights (partial rollout). Written whole and
    renamed into place, so a reader sees the previous notice or the new one, never a mix; named like the arenas, so
    a killed run's file is swept with them."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._seen: Optional[tuple[int, int]] = None

    @classmethod
    def create(cls, directory: Optional[str] = None) -> "PublicationNotice":
        directory = directory or (SHM_DIR if os.path.isdir(SHM_DIR) else tempfile.gettempdir())
        return cls(os.path.join(directory, f"{FILE_PREFIX}{os.getpid()}-notice-{uuid.uuid4().hex[:12]}.json"))

    def post(self, notice: Notice) -> None:
        expected = None if notice.expected is None else notice.expected.tolist()
        temporary = Path(self.path + ".tmp")
        temporary.write_text(json.dumps({"policy_version": notice.policy_version, "expected": expected}))
        os.replace(temporary, self.path)

    def read_if_new(self) -> Optional[Notice]:
        """The notice if the file changed since the last read here (one ``stat`` otherwise), else ``None``."""
        try:
            stat = os.stat(self.path)
        except FileNotFoundError:
            return None
        key = (stat.st_mtime_ns, stat.st_ino)
        if key == self._seen:
            return None
        self._seen = key
        payload = json.loads(Path(self.path).read_text())
        expected = payload["expected"]
        return Notice(int(payload["policy_version"]), None if expected is None else torch.tensor(expected,
                                                                                            dtype=torch.int64))

    def remove(self) -> None:
        for path in (self.path, self.path + ".tmp"):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
