"""Who generates, and how new weights reach them: the controller's one view of every placement.

- **engines in the actor** (``rollout.n_gpus = 0``, ``rollout.engine_process`` → ``actor``; the hybrid engine): the
  actor's group generates; a sync is the actor group's own ``sync_rollout_weights`` (the resharder; nothing for
  ``rollout.name=hf``).
- **replicas in processes of their own** — a standalone pool (``rollout.n_gpus = M``, split placement: ``M / t_g``
  replicas) or colocated ones (``rollout.engine_process`` → ``own``: ``devices / t_g`` replicas on the actor's
  devices; ``config/rollout_placement.py``). Each replica is a ``RolloutWorker`` group of ``t_g`` ranks. A batch is
  cut into one chunk per live replica, each chunk seeded by its position (not by who serves it), and sent to the
  replicas concurrently. A replica that dies is reported with its rank and its chunk is resubmitted to a live
  replica — same prompts, same seed, so the same samples — and the run goes on with the others; only when none is
  left does the error reach the trainer (``trainer.max_restarts`` then applies). A sync is two calls in order: every
  trainer rank publishes its rows (``ActorRolloutRefWorker.publish_weights``), then every live replica loads them,
  checked against the trainer ranks' summed fingerprints (with ``rollout.weight_transport=collective`` the publish
  posts its sends over each replica's process group and returns; the load receives them). Each generation names the
  ``policy_version`` it expects the engines to hold, so a skipped sync is an error, not a silent off-policy step.

**One policy version** (docs/concepts.md): the trainer owns the count — training steps done when the weights were
taken — and hands it to every sync (:meth:`Generation.sync_weights`) and every relabelling of unchanged weights
(:meth:`Generation.advance`); engines record it on each token, rows carry it (``Fields.POLICY_VERSION``).

Generation can run ahead of training (``async_training``, ``trainers/async_rollout.py``): :meth:`Generation.submit`
returns at once, and ``sync_weights(wait=False)`` queues the loads behind the generations in flight. A replica runs
its calls in the order they were made, so which weights generate a batch follows from the order of the controller's
calls alone — not from timing: every row records it (``policy_version``).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Optional, Sequence

import torch

from hybridrl.config.rollout_placement import colocated_replicas, replica_count, replicas_apart
from hybridrl.hybrid_engine.publish import Notice, PublicationNotice
from hybridrl.protocol import Batch, Fields
from hybridrl.rollout import holds_own_weights
from hybridrl.rollout.base import SamplingParams
from hybridrl.runtime import WorkerGroup
from hybridrl.runtime.errors import WorkerDiedError
from hybridrl.trainers.rl_setup import rollout_replica_roles
from hybridrl.utils.seeding import derive_seed
from hybridrl.workers.actor_worker import NO_WEIGHT_SYNC, ActorRolloutRefWorker
from hybridrl.workers.rollout_worker import RolloutWorker

if TYPE_CHECKING:
    from hybridrl.config.schema import TrainConfig
    from hybridrl.runtime import ResourcePoolManager

logger = logging.getLogger(__name__)


def even_sizes(total: int, parts: int) -> list[int]:
    """``total`` rows in ``parts`` contiguous chunks whose sizes differ by at most one (larger first)."""
    base, extra = divmod(total, parts)
    return [base + (index < extra) for index in range(parts)]


class Generation:
    """The generating group(s) and the weight sync into them (see the module docstring)."""

    def __init__(self, actor: WorkerGroup[ActorRolloutRefWorker], rollout_name: str,
                 replicas: Sequence[WorkerGroup[RolloutWorker]] = (), partial_rollout: bool = False) -> None:
        self.actor, self.rollout_name, self.replicas = actor, rollout_name, list(replicas)
        self.layout = actor.call(ActorRolloutRefWorker.published_layout) if self.replicas else None
        if self.layout is not None and self.layout.transport == "collective":
            self._open_channels()
        self.notice: Optional[PublicationNotice] = None  # partial rollout: replicas poll it during generation
        if partial_rollout and self.replicas:
            self.notice = PublicationNotice.create()
            for replica in self.replicas:
                replica.call(RolloutWorker.follow_publications, self.layout, self.notice.path)
        self.policy_version = 0  # of the weights the engines hold (or will, once the queued loads run)
        self.loads: list = []  # load futures queued by sync_weights(wait=False), not yet waited for
        self.replicas_lost = 0

    def _open_channels(self) -> None:
        """``rollout.weight_transport=collective``: a process group from the trainer's ranks to each replica's ranks,
        joined by both sides at once (the trainer's rank 0 hosts each rendezvous)."""
        for index, replica in enumerate(self.replicas):
            address = self.actor.call(ActorRolloutRefWorker.host_weight_channel, index, replica.world_size)
            joins = [self.actor.call_async(ActorRolloutRefWorker.join_weight_channel, index, address),
                     replica.call_async(RolloutWorker.join_weight_channel, address)]
            for join in joins:
                join.result()

    def live_replicas(self) -> list[WorkerGroup[RolloutWorker]]:
        return [replica for replica in self.replicas if not replica.is_stopped]

    def generate(self, prompts: Batch, params: SamplingParams) -> Batch:
        """``B`` prompts → ``B·n`` rows (a prompt's ``n`` responses consecutive) from whichever group generates."""
        return self.submit(prompts, params).result()

    def submit(self, prompts: Batch, params: SamplingParams) -> "PendingGeneration":
        """Start generating ``prompts`` and return at once; ``.result()`` waits for the rows. A replica runs its calls
        in order, so a batch submitted after a :meth:`sync_weights` is generated with those weights (the rows'
        ``policy_version`` is the sync's) and one submitted before it with the older ones."""
        if not self.replicas:
            future = self.actor.call_async(ActorRolloutRefWorker.generate_sequences, prompts, params)
            return PendingGeneration(self, [prompts], [params], {0: (future, self.policy_version)})
        live = self._require_live("generate_sequences")
        sizes = [size for size in even_sizes(len(prompts), len(live)) if size]
        chunks = prompts.split(sizes)
        seeded = [params if params.seed is None else params.with_seed(derive_seed(params.seed, "replica", index))
                  for index in range(len(chunks))]
        futures = {index: (self._call_generate(live[index], chunk, seeded[index]), self.policy_version)
                   for index, chunk in enumerate(chunks)}
        return PendingGeneration(self, chunks, seeded, futures)

    def _call_generate(self, replica: WorkerGroup[RolloutWorker], prompts: Batch, params: SamplingParams):
        return replica.call_async(RolloutWorker.generate_sequences, prompts, params, self.policy_version)

    def _replica_lost(self, error: WorkerDiedError, resubmitting: bool) -> WorkerGroup[RolloutWorker]:
        """Count and log a dead replica; the first live replica, which takes over its chunk when ``resubmitting``
        (a generation; a lost load just ends). Re-raises when none is left."""
        self.replicas_lost = len(self.replicas) - len(self.live_replicas())
        live = self.live_replicas()
        if not live:
            raise error
        what = f"its prompts are resubmitted to {live[0].name!r}" if resubmitting else "its weight load is dropped"
        logger.warning("rollout replica lost: %s; %s (%d of %d replicas left)", str(error).splitlines()[0][:300],
                       what, len(live), len(self.replicas))
        return live[0]

    def _require_live(self, method: str) -> list[WorkerGroup[RolloutWorker]]:
        live = self.live_replicas()
        if not live:
            raise RuntimeError(f"{method}: every rollout replica has died ({len(self.replicas)} lost)")
        return live

    def sync_weights(self, policy_version: Optional[int] = None, wait: bool = True) -> dict[str, float]:
        """Bring the generating engines to the actor's current weights, as those of the trainer's ``policy_version``
        (what later rows record; default: one more than the last); the sync's metrics.

        ``wait=False`` (standalone pool, asynchronous training): the loads are queued behind the generations the
        replicas are running and this returns after publishing; the metrics are those of the previous loads. The next
        sync (or :meth:`finish_loads`) waits for them first: the published arena is rewritten only once read.
        ``weight_sync/publish_seconds`` (replicas in processes of their own): this sync's publish, as the controller
        waited for it (the trainer ranks' copy and fingerprints, and the call)."""
        policy_version = self.policy_version + 1 if policy_version is None else policy_version
        if not self.replicas:
            self.policy_version = policy_version
            if not holds_own_weights(self.rollout_name):
                return dict(NO_WEIGHT_SYNC)
            return self.actor.call(ActorRolloutRefWorker.sync_rollout_weights, policy_version)
        previous = self.finish_loads()
        live = [index for index, replica in enumerate(self.replicas) if not replica.is_stopped]
        started = time.perf_counter()
        published = self.actor.call(ActorRolloutRefWorker.publish_weights, live, policy_version)
        publish_seconds = time.perf_counter() - started
        fingerprints = [publication.expected for publication in published]
        expected = None if fingerprints[0] is None else torch.stack(fingerprints).sum(0)
        rows = [reference for publication in published for reference in publication.rows]  # trainer rank order
        if self.notice is not None:  # a generation in flight may take these weights now (partial rollout)
            self.notice.post(Notice(policy_version, expected))
        self.loads = [replica.call_async(RolloutWorker.load_published_weights, self.layout, expected, policy_version,
                                         rows) for replica in self._require_live("load_published_weights")]
        self.policy_version = policy_version
        return {**(self.finish_loads() if wait else previous), "weight_sync/publish_seconds": publish_seconds}

    def advance(self, policy_version: int) -> None:
        """The trainer moved on to ``policy_version`` without changing the actor's weights (``trainer.critic_warmup``):
        the engines' weights are relabelled, nothing is moved. Standalone replicas take it in order, behind the
        generations they are running (a partial rollout's tokens in flight keep the older label: staleness is then
        over-counted, never under)."""
        if policy_version == self.policy_version:
            return
        if not self.replicas:
            if holds_own_weights(self.rollout_name):
                self.actor.call(ActorRolloutRefWorker.relabel_rollout_weights, policy_version)
        else:
            self.loads += [replica.call_async(RolloutWorker.relabel_weights, policy_version)
                           for replica in self._require_live("relabel_weights")]
        self.policy_version = policy_version

    def finish_loads(self) -> dict[str, float]:
        """Wait for the queued loads (and relabellings); the loads' metrics (empty when none was queued). A replica
        that died meanwhile is counted; its share moves to a live replica at the next generation."""
        metrics = []
        for future in self.loads:
            try:
                result = future.result()
            except WorkerDiedError as error:
                self._replica_lost(error, resubmitting=False)
                continue
            if result is not None:  # a relabelling returns nothing
                metrics.append(result)
        self.loads = []
        if not metrics:
            return {}
        return {**metrics[0], "rollout/replicas_live": float(len(metrics)),
                "rollout/replicas_lost": float(self.replicas_lost)}

    def close(self) -> None:
        """Remove the publication notice (partial rollout)."""
        if self.notice is not None:
            self.notice.remove()


def row_policy_versions(rows: Batch, submitted_at: int) -> torch.Tensor:
    """Each row's ``policy_version`` ``[B]``: the version of its oldest token when the engine recorded them
    (``token_policy_versions``, partial rollout), else ``submitted_at`` — the sync it was queued behind."""
    if Fields.TOKEN_POLICY_VERSIONS not in rows:
        return torch.full((len(rows),), submitted_at, dtype=torch.int64)
    versions = rows[Fields.TOKEN_POLICY_VERSIONS]
    valid = versions >= 0  # -1 past a row's end
    oldest = versions.masked_fill(~valid, torch.iinfo(torch.int64).max).min(-1).values
    return torch.where(valid.any(-1), oldest, submitted_at)


class PendingGeneration:
    """A batch being generated (:meth:`Generation.submit`): one future per chunk, each with the ``policy_version``
    of the weights it is generated with. :meth:`result` gathers the chunks in order; a chunk whose replica died is
    resubmitted — same prompts, same seed — to a live replica, with the weights that replica will then hold."""

    def __init__(self, generation: Generation, chunks: list[Batch], params: list[SamplingParams],
                 futures: dict) -> None:
        self.generation, self.chunks, self.params, self.futures = generation, chunks, params, futures
        self._rows: Optional[Batch] = None

    def result(self) -> Batch:
        """The ``B·n`` rows, with ``policy_version`` ``[B·n]`` (int64) per row; waits for the chunks still running."""
        if self._rows is not None:
            return self._rows
        outputs: dict[int, Batch] = {}
        while self.futures:
            index, (future, policy_version) = next(iter(self.futures.items()))
            del self.futures[index]
            try:
                rows = future.result()
            except WorkerDiedError as error:
                if not self.generation.replicas:
                    raise
                replica = self.generation._replica_lost(error, resubmitting=True)
                self.futures[index] = (self.generation._call_generate(replica, self.chunks[index], self.params[index]),
                                       self.generation.policy_version)
                continue
            rows[Fields.POLICY_VERSION] = row_policy_versions(rows, policy_version)
            outputs[index] = rows
        self._rows = Batch.concat([outputs[index] for index in range(len(self.chunks))])
        return self._rows


def start_generation(config: "TrainConfig", pools: "ResourcePoolManager", *, total_steps: int,
                     with_reference: bool, partial_rollout: bool = False) -> Generation:
    """Start the groups that generate — the actor group (``actor_rollout_ref``; engines in its processes unless
    they run apart) and, for replicas in processes of their own, one ``RolloutWorker`` group per replica
    (``rollout0 …``: on the standalone pool's devices, or on ``t_g`` of the actor's beside its ranks) — on ``pools``
    (created), and return their :class:`Generation`. On a failure the groups already started are shut down before it
    propagates."""
    share = 1.0 / len(pools.roles_in("global"))  # colocated roles: separate processes on each bundle
    tp = config.rollout.tensor_model_parallel_size
    started: list[WorkerGroup] = []
    try:
        actor = WorkerGroup(ActorRolloutRefWorker, pools.pool_for("actor"), name="actor_rollout_ref",
                            bundle_share=share, args=(config, total_steps, with_reference),
                            tp_size=1 if replicas_apart(config) else tp,
                            sp_size=config.actor.ulysses_sequence_parallel_size)
        started.append(actor)
        for index, (pool, bundle_share) in enumerate(_replica_pools(config, pools, share)):
            started.append(WorkerGroup(RolloutWorker, pool, name=f"rollout{index}", args=(config,), tp_size=tp,
                                       bundle_share=bundle_share))
        return Generation(actor, config.rollout.name, started[1:], partial_rollout=partial_rollout)
    except BaseException:
        for group in reversed(started):
            group.shutdown()
        raise


def _replica_pools(config: "TrainConfig", pools: "ResourcePoolManager", share: float) -> list:
    """Each replica's devices and its share of them: a standalone replica's own pool, whole; a colocated replica's
    ``t_g`` devices of the actor's pool (ranks ``d·t_g …``), shared with the actor's ranks there."""
    if not colocated_replicas(config):
        return [(pools.pool_for(role), 1.0) for role in rollout_replica_roles(config)]
    tp, actor_pool = config.rollout.tensor_model_parallel_size, pools.pool_for("actor")
    return [(actor_pool.slice(index * tp, tp), share) for index in range(replica_count(config))]
