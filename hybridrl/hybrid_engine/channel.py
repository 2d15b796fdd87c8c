"""A process group from the trainer's ranks to one replica's ranks, which published rows travel over
(``rollout.weight_transfer=collective``, ``hybrid_engine/publish.py``): gloo over TCP on CPU, NCCL on GPU.

The group has ``W + t`` members: the trainer's ``W`` ranks (the *writers*, group ranks ``0 … W-1``, each holding
its FSDP rows of every parameter) and the replica's ``t`` tensor-parallel ranks (the *readers*, ``W … W+t-1``, each
reading full tensors: vLLM narrows its slices itself). A publication is one point-to-point message per
(writer, reader) pair: writer ``w`` sends its flat buffer of rows — the object-store transport's buffer — to every
reader, whole or as a delta against the previous publication (``rollout.weight_delta``: ``delta.py``'s frames), and
each reader receives the ``W`` buffers and assembles the full tensors from them.

Each publication is preceded, on every pair, by a small header: the ``policy_version`` it carries and the frame's
kind and sizes (a delta's size is known only to its writer). Messages of
one pair arrive in the order they were posted, so a reader that finds another version than the one its load was
called for has met a publication that was never paired with its load, and refuses it (the fingerprints would catch
it too, but only with ``rollout.verify_weight_sync`` on).

Sends are posted and return at once (the transport moves the bytes in the background), so a trainer publishing for
a replica that is still generating (``async_training``) does not wait for it. The buffer and its sends are held
until the next publication, which the controller starts only once every live replica's load returned, so by then
they are complete; ``timeout_s`` bounds how long a posted send may wait for its receive (NCCL's watchdog counts from
the post), so it must exceed the longest generation a replica runs before it loads.

One channel per replica: a replica that dies takes only its own channel down — a send that fails, or a replica the
controller reports lost, abandons its channel (:meth:`WeightChannel.abandon`) and the others go on. The replica
receives whole buffers in the group's device memory (GPU with NCCL): room for one more copy of its share of the
rows, besides the engine's weights.

Opening is collective over the group: the trainer's rank 0 hosts the rendezvous store (:func:`host_channel`), the
controller hands its :class:`ChannelAddress` to every member, and each builds the group (:meth:`WeightChannel.join`),
which connects every (writer, reader) pair with one small message and so returns once all ``W + t`` have joined
(NCCL would otherwise connect a pair at its first message, inside a publication, while the reader is not yet
listening). The address is picklable; the store lives as long as the hosting rank keeps it.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import Optional

import torch
import torch.distributed as dist

from hybridrl.hybrid_engine.delta import KINDS, DeltaFrame
from hybridrl.utils.distributed import node_address

BACKENDS = ("gloo", "nccl")

HEADER_NUMBERS = 6
"""A frame's header: version, kind (its index in ``KINDS``), base version (-1: none), values in the whole buffer,
bytes of values, bytes of positions (0: none)."""


@dataclass(frozen=True)
class ChannelAddress:
    """Where a channel's members meet (the trainer rank 0's store) and what the group is."""

    host: str
    port: int
    writers: int
    readers: int
    backend: str = "gloo"
    timeout_s: float = 1800.0
    """How long a member waits for the others — to join, or for a message — before the call fails
    (``rollout.weight_transfer_timeout_s``)."""

    @property
    def world_size(self) -> int:
        return self.writers + self.readers

    @property
    def device(self) -> torch.device:
        """Where the messages' buffers live: the current GPU for NCCL, host memory for gloo."""
        return torch.device("cuda", torch.cuda.current_device()) if self.backend == "nccl" else torch.device("cpu")


def host_channel(writers: int, readers: int, backend: str = "gloo",
                 timeout_s: float = 1800.0, host: Optional[str] = None) -> tuple[dist.TCPStore, ChannelAddress]:
    """The rendezvous store of a channel (on a free port of ``host``, default this node's IP) and its address.
    Keep the store until every member has joined (the hosting rank keeps it for the channel's life)."""
    if backend not in BACKENDS:
        raise ValueError(f"channel backend must be one of {BACKENDS}, got {backend!r}")
    host = host or node_address()
    store = dist.TCPStore(host, 0, writers + readers, True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=timeout_s))
    return store, ChannelAddress(host, store.port, writers, readers, backend, timeout_s)


class WeightChannel:
    """One member's end of a channel (see the module docstring). ``group``: the torch backend (gloo or NCCL)."""

    def __init__(self, group, address: ChannelAddress, rank: int) -> None:
        self.group, self.address, self.rank = group, address, rank
        self._pending: list = []  # the last publication's send works, header and buffer (alive until complete)

    @classmethod
    def join(cls, address: ChannelAddress, rank: int) -> "WeightChannel":
        """Build the group as member ``rank`` (writers ``0 … W-1``, readers ``W …``) and connect every
        (writer, reader) pair; blocks until every member has joined."""
        if not 0 <= rank < address.world_size:
            raise ValueError(f"channel rank {rank} is outside its {address.world_size} members")
        timeout = datetime.timedelta(seconds=address.timeout_s)
        store = dist.TCPStore(address.host, address.port, address.world_size, False, timeout=timeout)
        if address.backend == "nccl":
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = timeout
            group = dist.ProcessGroupNCCL(store, rank, address.world_size, options)
        else:
            options = dist.ProcessGroupGloo._Options()
            options._timeout = timeout
            options._devices = [_gloo_device()]
            group = dist.ProcessGroupGloo(store, rank, address.world_size, options)
        channel = cls(group, address, rank)
        channel._connect_pairs()
        return channel

    @property
    def is_writer(self) -> bool:
        return self.rank < self.address.writers

    @property
    def readers(self) -> range:
        return range(self.address.writers, self.address.world_size)

    def _connect_pairs(self) -> None:
        """One message on every (writer, reader) pair, so that each is connected before the first publication."""
        token = torch.zeros(1, dtype=torch.int64, device=self.address.device)
        if self.is_writer:
            works = [self.group.send([token], reader, 0) for reader in self.readers]
        else:
            works = [self.group.recv([token], writer, 0) for writer in range(self.address.writers)]
        for work in works:
            work.wait()

    def send(self, frame: DeltaFrame) -> None:
        """Writer: post ``frame`` (a whole buffer or a delta, ``delta.py``; tensors on the channel's device) to every
        reader, headed by its version and sizes, and return; the sends complete in the background.
        :meth:`wait_sent` first, for the previous publication's."""
        assert self.is_writer, "only a trainer rank sends"
        self.wait_sent()
        base = -1 if frame.base_version is None else frame.base_version
        payloads = [frame.values.view(torch.uint8)]
        if frame.positions is not None:
            payloads.append(frame.positions.view(torch.uint8))
        header = torch.tensor([frame.version, KINDS.index(frame.kind), base, frame.numel,
                               *(payload.numel() for payload in payloads), *([0] * (2 - len(payloads)))],
                              dtype=torch.int64, device=frame.values.device)
        messages = [header, *(payload for payload in payloads if payload.numel())]  # the header gives the sizes
        works = [self.group.send([tensor], reader, 0) for reader in self.readers for tensor in messages]
        self._pending = [*messages, *works]

    def wait_sent(self) -> None:
        """Writer: wait for the last publication's sends (on NCCL: until the device stream has them ordered)."""
        for item in self._pending:
            if not isinstance(item, torch.Tensor):
                item.wait()
        self._pending = []

    def receive(self, dtype: torch.dtype, policy_version: int) -> list[DeltaFrame]:
        """Reader: the writers' frames of the publication of ``policy_version`` (values of ``dtype``), in writer
        order; ``ValueError`` when a writer's header names another version."""
        assert not self.is_writer, "only a replica rank receives"
        device = self.address.device
        headers = [torch.empty(HEADER_NUMBERS, dtype=torch.int64, device=device)
                   for _ in range(self.address.writers)]
        for work in [self.group.recv([header], writer, 0) for writer, header in enumerate(headers)]:
            work.wait()
        frames = []
        for writer, header in enumerate(headers):
            version, kind, base, numel, values_bytes, positions_bytes = header.tolist()
            if version != policy_version:
                raise ValueError(f"trainer rank {writer} sent the weights of version {version} where version "
                                 f"{policy_version} was expected: a publication was not paired with its load")
            kind = KINDS[kind]
            values = torch.empty(values_bytes, dtype=torch.uint8, device=device)
            positions = None if kind == "full" else torch.empty(positions_bytes, dtype=torch.uint8, device=device)
            for work in [self.group.recv([tensor], writer, 0) for tensor in (values, positions)
                         if tensor is not None and tensor.numel()]:
                work.wait()
            if positions is not None:
                positions = positions.view(torch.int32 if kind == "indices" else torch.uint8)
            frames.append(DeltaFrame(kind, version, None if base < 0 else base, numel, values.view(dtype), positions))
        return frames

    def abandon(self) -> None:
        """Writer: the replica at the other end died; stop waiting for it and abort the group (a send posted to it
        never completes; its buffer stays referenced until this channel goes)."""
        self.group.abort()

    def close(self) -> None:
        """Shut the group down (its last sends are not waited for)."""
        self.group.shutdown()


def _gloo_device():
    """Gloo's transport device: the interface ``GLOO_SOCKET_IFNAME`` names (as torch's own groups honour), else this
    node's IP — the address the other node reaches."""
    interface = os.environ.get("GLOO_SOCKET_IFNAME")
    if interface:
        return dist.ProcessGroupGloo.create_device(interface=interface.split(",")[0])
    return dist.ProcessGroupGloo.create_device(hostname=node_address())
