"""A tensor-parallel replica's request queue driven by one rank: the episodes (and their tools) run once per replica.

vLLM's external launcher runs one scheduler per tensor-parallel rank; the ranks stay in step only if every one of
them queues the same requests in the same order before the same engine step. Single-turn generation does that by
construction (same prompts, same seed, submitted at once). An agent loop does not: a tool's answer arrives on its own
time, so each rank would submit the next turn at a different step — and each rank would run the tool itself, its
side effects ``t_g`` times over.

So the replica's TP rank 0 (the leader) runs the agent loop on a :class:`LeaderRequests`: each of its submits is
recorded, and each engine step first sends the submits since the last step to the other ranks (one
``broadcast_object_list`` over the replica's TP group). The followers run :func:`follow`: queue what the leader
queued, step when it steps, until it says the episodes are done. Tools, environments and rewards exist on the leader
only; the followers hold no episode state at all.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import torch.distributed as dist

from hybridrl.rollout.base import SamplingParams


@dataclass
class _Message:
    """What the leader sends before each engine step: what it did to its queue since the last one, in order —
    ``("submit", prompt, params, request_id, streamed)`` or ``("abort", request_id)`` — and whether the episodes are
    over (then no step follows)."""

    operations: list[tuple] = field(default_factory=list)
    done: bool = False


@dataclass(frozen=True)
class ReplicaGroup:
    """A tensor-parallel replica's ranks: ``group`` (its TP process group), the global rank of its ``leader`` (TP
    rank 0) and this process's global ``rank``."""

    group: Any
    leader: int
    rank: int

    @property
    def is_leader(self) -> bool:
        return self.rank == self.leader

    @classmethod
    def of(cls, rollout_mesh, tp_size: int) -> Optional["ReplicaGroup"]:
        """This rank's replica in a ``("dp", "tp")`` rollout mesh; ``None`` for ``t_g = 1`` (a replica of one)."""
        if tp_size == 1 or rollout_mesh is None:
            return None
        rank = dist.get_rank()
        return cls(rollout_mesh.get_group("tp"), rank - rank % tp_size, rank)

    def broadcast(self, message: Optional[_Message]) -> _Message:
        box = [message]
        dist.broadcast_object_list(box, src=self.leader, group=self.group)
        return box[0]


class LeaderRequests:
    """The leader's request queue (what its replica server drives for the agent loop): ``requests`` (a
    ``VLLMRequests``) with every submit and abort mirrored to the replica's other ranks before the next step. Call
    :meth:`finish` when the episodes are done (the followers stop waiting). Pausing is not mirrored, so refused."""

    def __init__(self, requests, replica: ReplicaGroup) -> None:
        self.requests, self.replica = requests, replica
        self._pending: list[tuple] = []

    def submit(self, prompt_token_ids: Sequence[int], params: SamplingParams, request_id: Optional[str] = None,
               streamed: bool = True) -> str:
        submitted = self.requests.submit(prompt_token_ids, params, request_id=request_id, streamed=streamed)
        self._pending.append(("submit", list(prompt_token_ids), params, submitted, streamed))
        return submitted

    def abort(self, request_id: str):
        completion = self.requests.abort(request_id)
        self._pending.append(("abort", request_id))
        return completion

    def step(self) -> list[Any]:
        message, self._pending = _Message(self._pending), []
        self.replica.broadcast(message)
        return self.requests.step()

    def has_work(self) -> bool:
        return self.requests.has_work()

    @property
    def in_flight(self) -> list[str]:
        return self.requests.in_flight

    @property
    def paused(self) -> Optional[str]:
        return self.requests.paused

    def pause(self, mode: str) -> list:
        raise RuntimeError("a tensor-parallel replica's leader cannot pause alone: its followers would step on")

    def resume(self) -> list[str]:
        raise RuntimeError("a tensor-parallel replica's leader cannot pause alone: its followers would step on")

    def finish(self) -> None:
        """Release the followers (also after a failure on the leader: call it in a ``finally``). What the leader did
        since the last step goes with it, so every rank's engine holds the same queue afterwards."""
        message, self._pending = _Message(self._pending, done=True), []
        self.replica.broadcast(message)


def follow(requests, replica: ReplicaGroup) -> int:
    """A follower rank's side: do to its queue what the leader did and step when it steps, until it finishes;
    returns the number of engine steps taken (equal to the leader's)."""
    steps = 0
    while True:
        message = replica.broadcast(None)
        for operation, *args in message.operations:
            if operation == "submit":
                prompt, params, request_id, streamed = args
                requests.submit(prompt, params, request_id=request_id, streamed=streamed)
            else:
                requests.abort(*args)
        if message.done:
            return steps
        requests.step()
        steps += 1
