"""The actor's side of MoE routing replay (``actor.router_replay.mode``, docs/training.md "MoE routing replay"): the
hooks on its model (:mod:`hybridrl.modeling.routing_replay`), the check that a batch carries the rollout's routing,
and the agreement metric — how often the actor's own routers chose the experts the rollout routed each token to."""

from __future__ import annotations

from typing import Callable, Optional

from torch import nn

from hybridrl.modeling.routing_replay import install_routing_replay
from hybridrl.protocol import Batch, Fields
from hybridrl.engines.micro_batches import DataParallelGroup

AGREEMENT_META = "routing_agreement"
"""The ``Batch.meta`` key the old-log-prob pass reports the agreement under (``actor/routing_agreement``)."""


class ActorRouting:
    """``mode``: ``R3`` replays, ``record`` only measures, ``disabled`` installs nothing."""

    def __init__(self, model: nn.Module, mode: str) -> None:
        self.mode = mode
        self.state = None if mode == "disabled" else install_routing_replay(model, replay=mode == "R3")

    @property
    def enabled(self) -> bool:
        return self.state is not None

    def measured(self, batch: Batch, ranks: DataParallelGroup, forwards: Callable[[], object]) -> tuple[object, Optional[float]]:
        """``forwards()``'s result and the agreement over its router calls on every rank of ``ranks`` (``None``:
        routing replay is off). Refuses a batch without the rollout's routing."""
        if self.state is None:
            return forwards(), None
        if Fields.ROUTED_EXPERTS not in batch:
            raise ValueError(f"actor.router_replay.mode={self.mode} but the batch has no {Fields.ROUTED_EXPERTS!r}: "
                             "the rollout engine did not record routing (rollout.name=hf records it)")
        self.state.reset()
        result = forwards()
        recorded_here = bool((batch[Fields.ROUTED_EXPERTS] >= 0).any())
        if recorded_here and self.state.recorded == 0:  # the keyword never reached the routers: nothing replayed
            raise RuntimeError(f"actor.router_replay.mode={self.mode}: the batch carries recorded routing but no "
                               "router of the model saw it (its decoder layers do not pass forward keywords on)")
        return result, self.state.agreement(ranks.group)
