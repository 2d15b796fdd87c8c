"""Who generates, and how new weights reach them: the controller's one view of colocated and standalone rollout.

- **colocated** (``rollout.n_gpus = 0``, the hybrid engine): the actor's group generates; a sync is the actor group's
  own ``sync_rollout_weights`` (the resharder; nothing for ``rollout.name=hf``).
- **standalone** (``rollout.n_gpus = M``, split placement): ``M / t_g`` replicas, each a ``RolloutWorker`` group of
  ``t_g`` ranks. A batch is cut into one chunk per live replica, each chunk seeded by its position (not by who serves
  it), and sent to the replicas concurrently. A replica that dies is reported with its rank and its chunk is
  resubmitted to a live replica — same prompts, same seed, so the same samples — and the run goes on with the
  others; only when none is left does the error reach the trainer (``trainer.max_restarts`` then applies).
  A sync is two calls in order: every trainer rank publishes its rows (``ActorRolloutRefWorker.publish_weights``),
  then every live replica loads them, checked against the trainer ranks' summed fingerprints. Each generation names
  the actor version it expects the engines to hold, so a skipped sync is an error, not a silent off-policy step.
"""

from __future__ import annotations

import logging
from typing import Optional, Sequence

import torch

from hybridrl.protocol import Batch
from hybridrl.rollout import holds_own_weights
from hybridrl.rollout.base import SamplingParams
from hybridrl.runtime import WorkerGroup
from hybridrl.runtime.errors import WorkerDiedError
from hybridrl.utils.seeding import derive_seed
from hybridrl.workers.actor_worker import NO_WEIGHT_SYNC, ActorRolloutRefWorker
from hybridrl.workers.rollout_worker import RolloutWorker

logger = logging.getLogger(__name__)


def even_sizes(total: int, parts: int) -> list[int]:
    """``total`` rows in ``parts`` contiguous chunks whose sizes differ by at most one (larger first)."""
    base, extra = divmod(total, parts)
    return [base + (index < extra) for index in range(parts)]


class Generation:
    """The generating group(s) and the weight sync into them (see the module docstring)."""

    def __init__(self, actor: WorkerGroup[ActorRolloutRefWorker], rollout_name: str,
                 replicas: Sequence[WorkerGroup[RolloutWorker]] = ()) -> None:
        self.actor, self.rollout_name, self.replicas = actor, rollout_name, list(replicas)
        self.layout = actor.call(ActorRolloutRefWorker.published_layout) if self.replicas else None
        self.version: Optional[int] = None  # the actor version the replicas hold (standalone); None: as loaded
        self.replicas_lost = 0

    def live_replicas(self) -> list[WorkerGroup[RolloutWorker]]:
        return [replica for replica in self.replicas if not replica.is_stopped]

    def generate(self, prompts: Batch, params: SamplingParams) -> Batch:
        """``B`` prompts → ``B·n`` rows (a prompt's ``n`` responses consecutive) from whichever group generates."""
        if not self.replicas:
            return self.actor.call(ActorRolloutRefWorker.generate_sequences, prompts, params)
        live = self._require_live("generate_sequences")
        sizes = [size for size in even_sizes(len(prompts), len(live)) if size]
        chunks = prompts.split(sizes)
        seeded = [params if params.seed is None else params.with_seed(derive_seed(params.seed, "replica", index))
                  for index in range(len(chunks))]
        futures = {index: live[index].call_async(RolloutWorker.generate_sequences, chunk, seeded[index],
                                                 self.version) for index, chunk in enumerate(chunks)}
        outputs: dict[int, Batch] = {}
        while futures:
            index, future = next(iter(futures.items()))
            del futures[index]
            try:
                outputs[index] = future.result()
            except WorkerDiedError as error:
                replica = self._resubmit_to(error)
                futures[index] = replica.call_async(RolloutWorker.generate_sequences, chunks[index], seeded[index],
                                                    self.version)
        return Batch.concat([outputs[index] for index in range(len(chunks))])

    def _resubmit_to(self, error: WorkerDiedError) -> WorkerGroup[RolloutWorker]:
        """The live replica that takes over a dead one's chunk (the least-used first); re-raises when none is left."""
        self.replicas_lost = len(self.replicas) - len(self.live_replicas())
        live = self.live_replicas()
        if not live:
            raise error
        logger.warning("rollout replica lost: %s; its prompts are resubmitted to %r (%d of %d replicas left)",
                       str(error).splitlines()[0][:300], live[0].name, len(live), len(self.replicas))
        return live[0]

    def _require_live(self, method: str) -> list[WorkerGroup[RolloutWorker]]:
        live = self.live_replicas()
        if not live:
            raise RuntimeError(f"{method}: every rollout replica has died ({len(self.replicas)} lost)")
        return live

    def sync_weights(self) -> dict[str, float]:
        """Bring the generating engines to the actor's current weights; the sync's metrics."""
        if not self.replicas:
            if not holds_own_weights(self.rollout_name):
                return dict(NO_WEIGHT_SYNC)
            return self.actor.call(ActorRolloutRefWorker.sync_rollout_weights)
        published = self.actor.call(ActorRolloutRefWorker.publish_weights)
        versions = {version for version, _ in published}
        if len(versions) != 1:
            raise RuntimeError(f"the trainer's ranks disagree on the weight version: {sorted(versions)}")
        fingerprints = [expected for _, expected in published]
        expected = None if fingerprints[0] is None else torch.stack(fingerprints).sum(0)
        version = versions.pop()
        futures = [replica.call_async(RolloutWorker.load_published_weights, self.layout, expected, version)
                   for replica in self._require_live("load_published_weights")]
        metrics = []
        for future in futures:
            try:
                metrics.append(future.result())
            except WorkerDiedError as error:  # the others loaded; the dead one's share moves at the next generate
                self._resubmit_to(error)
        self.version = version
        return {**metrics[0], "rollout/replicas_live": float(len(metrics)),
                "rollout/replicas_lost": float(self.replicas_lost)}
