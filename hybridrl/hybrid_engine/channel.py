"""A process group from the trainer's ranks to one replica's ranks, which published rows travel over
(``rollout.weight_transport=collective``, ``hybrid_engine/publish.py``): gloo over TCP on CPU, NCCL on GPU.

The group has ``W + t`` members: the trainer's ``W`` ranks (the *writers*, group ranks ``0 … W-1``, each holding
its FSDP rows of every parameter) and the replica's ``t`` tensor-parallel ranks (the *readers*, ``W … W+t-1``, each
reading full tensors: vLLM narrows its slices itself). A publication is one point-to-point message per
(writer, reader) pair: writer ``w`` sends its flat buffer of rows — the object-store transport's buffer — to every
reader, and each reader receives the ``W`` buffers and assembles the full tensors from them.

Sends are posted and return at once (the transport moves the bytes in the background), so a trainer publishing for
a replica that is still generating (``async_training``) does not wait for it. The buffer and its sends are held
until the next publication, which the controller starts only once every live replica's load returned, so by then
they are complete. Messages of one pair arrive in the order they were posted: no tags are needed.

One channel per replica: a replica that dies takes only its own channel down, and the trainer stops sending to it
(:meth:`WeightChannel.abandon`).

Opening is collective over the group: the trainer's rank 0 hosts the rendezvous store (:func:`host_channel`), the
controller hands its :class:`ChannelAddress` to every member, and each builds the group (:meth:`WeightChannel.join`),
which returns once all ``W + t`` have. The address is picklable; the store lives as long as the hosting rank keeps it.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import Optional, Sequence

import torch
import torch.distributed as dist

BACKENDS = ("gloo", "nccl")


@dataclass(frozen=True)
class ChannelAddress:
    """Where a channel's members meet (the trainer rank 0's store) and what the group is."""

    host: str
    port: int
    writers: int
    readers: int
    backend: str = "gloo"
    timeout_s: float = 600.0
    """How long a member waits for the others — to join, or for a message — before the call fails."""

    @property
    def world_size(self) -> int:
        return self.writers + self.readers

    @property
    def device(self) -> torch.device:
        """Where the messages' buffers live: the current GPU for NCCL, host memory for gloo."""
        return torch.device("cuda", torch.cuda.current_device()) if self.backend == "nccl" else torch.device("cpu")


def node_address() -> str:
    """This process's node IP as Ray knows it (``127.0.0.1`` outside Ray)."""
    import ray

    return ray.util.get_node_ip_address() if ray.is_initialized() else "127.0.0.1"


def host_channel(writers: int, readers: int, backend: str = "gloo",
                 timeout_s: float = 600.0, host: Optional[str] = None) -> tuple[dist.TCPStore, ChannelAddress]:
    """The rendezvous store of a channel (on a free port of ``host``, default this node's IP) and its address.
    Keep the store until every member has joined (the hosting rank keeps it for the channel's life)."""
    if backend not in BACKENDS:
        raise ValueError(f"channel backend must be one of {BACKENDS}, got {backend!r}")
    host = host or node_address()
    store = dist.TCPStore(host, 0, writers + readers, True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=timeout_s))
    return store, ChannelAddress(host, store.port, writers, readers, backend, timeout_s)


class WeightChannel:
    """One member's end of a channel (see the module docstring)."""

    def __init__(self, group: dist.ProcessGroup, address: ChannelAddress, rank: int) -> None:
        self.group, self.address, self.rank = group, address, rank
        self._pending: list = []  # the last publication's send works and its buffer (kept alive until complete)

    @classmethod
    def join(cls, address: ChannelAddress, rank: int, store: Optional[dist.Store] = None) -> "WeightChannel":
        """Build the group as member ``rank`` (writers ``0 … W-1``, readers ``W …``); blocks until every member has
        joined. ``store``: the hosting rank's own store (others connect to ``address``)."""
        if not 0 <= rank < address.world_size:
            raise ValueError(f"channel rank {rank} is outside its {address.world_size} members")
        timeout = datetime.timedelta(seconds=address.timeout_s)
        if store is None:
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
        return cls(group, address, rank)

    @property
    def is_writer(self) -> bool:
        return self.rank < self.address.writers

    def send(self, buffer: torch.Tensor) -> None:
        """Writer: post ``buffer`` (1-D, contiguous) to every reader and return; the sends complete in the background.
        Waits first for the previous publication's sends (complete by the time the controller publishes again)."""
        assert self.is_writer, "only a trainer rank sends"
        self.wait_sent()
        payload = buffer.view(torch.uint8)
        works = [self.group.send([payload], reader, 0)
                 for reader in range(self.address.writers, self.address.world_size)]
        self._pending = [payload, *works]

    def wait_sent(self) -> None:
        """Writer: block until the last publication's sends completed."""
        for item in self._pending:
            if not isinstance(item, torch.Tensor):
                item.wait()
        self._pending = []

    def receive(self, numels: Sequence[int], dtype: torch.dtype) -> list[torch.Tensor]:
        """Reader: the writers' buffers of one publication, ``numels[w]`` elements of ``dtype`` from writer ``w``."""
        assert not self.is_writer, "only a replica rank receives"
        if len(numels) != self.address.writers:
            raise ValueError(f"{len(numels)} buffer sizes for a channel of {self.address.writers} writers")
        buffers = [torch.empty(numel, dtype=dtype, device=self.address.device) for numel in numels]
        works = [self.group.recv([buffer.view(torch.uint8)], writer, 0) for writer, buffer in enumerate(buffers)]
        for work in works:
            work.wait()
        return buffers

    def abandon(self) -> None:
        """Writer: the replica at the other end died; stop waiting on what was sent to it. The posted sends and
        their buffer stay referenced (released with the channel), so the transport never reads freed memory."""
        self._abandoned = self._pending
        self._pending = []


def _gloo_device():
    """Gloo's transport device: the interface ``GLOO_SOCKET_IFNAME`` names (as torch's own groups honour), else this
    node's IP — the address the other node reaches."""
    interface = os.environ.get("GLOO_SOCKET_IFNAME")
    if interface:
        return dist.ProcessGroupGloo.create_device(interface=interface.split(",")[0])
    return dist.ProcessGroupGloo.create_device(hostname=node_address())
