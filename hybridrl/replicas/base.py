"""The controller's view of one rollout replica: one engine (``t_g`` tensor-parallel ranks), wherever it lives.

The controller (``trainers/generation.py``) holds a list of :class:`Replica` and never asks where one lives: in
the actor's processes (:mod:`hybridrl.replicas.in_actor`, the hybrid engine) or in processes of their own, on the
actor's devices or on a pool of their own (:mod:`hybridrl.replicas.own_processes`). How new weights reach them is
the :class:`~hybridrl.replicas.transfer.WeightTransfer` started beside them (``placement.start_generators``).

Every method returns at once with a future (``.result()`` waits); a replica runs the calls made to it in the order
they were made, so which weights generate a batch follows from the order of the controller's calls alone.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional, Protocol

if TYPE_CHECKING:
    import torch

    from hybridrl.hybrid_engine.publish import PublishedLayout
    from hybridrl.protocol import Batch
    from hybridrl.rollout.base import SamplingParams
    from hybridrl.runtime import WorkerGroup


class Pending(Protocol):
    """A call in flight: ``result()`` waits for its value (or raises the worker's error)."""

    def result(self) -> Any: ...


def finished(value: Any) -> Future:
    """A call that needed no worker: already done, with ``value``."""
    future: Future = Future()
    future.set_result(value)
    return future


@dataclass
class Publication:
    """One version of the trainer's weights as published for replicas in processes of their own: where they are
    (``layout``), the trainer ranks' fingerprints summed (``expected`` ``[t_g, params]``; ``None``: unchecked) and
    the object-store references of the trainer ranks' rows in rank order (``rows``; empty for other transports)."""

    layout: "PublishedLayout"
    expected: Optional["torch.Tensor"]
    rows: list = field(default_factory=list)


class Replica(ABC):
    """One generating engine as the controller drives it (see the module docstring)."""

    name: str

    @property
    @abstractmethod
    def is_stopped(self) -> bool:
        """Whether its processes are gone (a replica that died is stopped; its work goes to a live one)."""

    @abstractmethod
    def generate(self, prompts: "Batch", params: "SamplingParams", policy_version: int) -> Pending:
        """``B`` prompts → ``B·n`` rows, generated with the weights of ``policy_version`` (what the last
        :meth:`update_weights` or :meth:`relabel_weights` made it hold)."""

    @abstractmethod
    def update_weights(self, publication: Optional[Publication], policy_version: int) -> Pending:
        """Load the trainer's weights of ``policy_version`` (``publication``: what the transfer published; ``None``
        where the replica reads the actor's own module). The future's value: the load's metrics
        (``weight_sync/seconds``, ``weight_sync/bytes``, ``weight_sync/delivered_bytes``)."""

    @abstractmethod
    def relabel_weights(self, policy_version: int) -> Optional[Pending]:
        """The trainer moved on to ``policy_version`` without changing the weights: relabel, move nothing
        (``None`` when already done)."""

    def busy_seconds(self) -> Optional[float]:
        """Seconds its processes spent inside calls since the last reading (``None`` where it lives in another
        role's processes, whose own timings count them)."""
        return None

    def groups(self) -> list["WorkerGroup"]:
        """The worker groups this replica started and stops (none where it lives in another role's processes)."""
        return []

    def shutdown(self) -> None:
        """Stop the processes this replica started (none where it lives in another role's)."""
        for group in self.groups():
            group.shutdown()
