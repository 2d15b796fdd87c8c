"""Who generates, and how new weights reach them: the controller's one view of every placement.

:class:`Generation` holds a list of replicas (:class:`hybridrl.replicas.Replica`) and the transfer that brings them
the actor's weights; where a replica lives — the actor's processes, processes of their own on the actor's devices,
or a pool of its own — is the replica's business (``hybridrl/replicas/``), never asked here.

A batch is cut into one chunk per live replica (the first chunk keeps the batch's seed, chunk ``i > 0`` samples with
a seed derived from ``i``: seeded by position, not by who serves it), and the chunks are sent to the replicas
concurrently. A replica that dies is reported with its rank and its
chunk is resubmitted to a live replica — same prompts, same seed, so the same samples — and the run goes on with the
others; only when none is left does the error reach the trainer (``trainer.max_restarts`` then applies). A sync is
the transfer's publish, then every live replica's load (checked against the trainer ranks' summed fingerprints
where the weights are published). Each generation names the ``policy_version`` it expects the engines to hold, so a
skipped sync is an error, not a silent off-policy step.

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
from typing import Optional, Sequence

import torch

from hybridrl.protocol import Batch, Fields
from hybridrl.replicas import Replica, WeightTransfer
from hybridrl.rollout.base import SamplingParams
from hybridrl.runtime.errors import WorkerDiedError
from hybridrl.utils.seeding import derive_seed

logger = logging.getLogger(__name__)


def even_sizes(total: int, parts: int) -> list[int]:
    """``total`` rows in ``parts`` contiguous chunks whose sizes differ by at most one (larger first)."""
    base, extra = divmod(total, parts)
    return [base + (index < extra) for index in range(parts)]


def chunk_params(params: SamplingParams, index: int) -> SamplingParams:
    """The sampling parameters of a batch's chunk ``index``: the batch's own for the first, a seed derived from the
    position for the others (unseeded stays unseeded)."""
    if params.seed is None or index == 0:
        return params
    return params.with_seed(derive_seed(params.seed, "replica", index))


class Generation:
    """The replicas and the weight sync into them (see the module docstring).

    Args:
        replicas: every replica, in index order (``hybridrl.replicas.start_generators``).
        transfer: how the actor's weights leave it for them.
    """

    def __init__(self, replicas: Sequence[Replica], transfer: WeightTransfer) -> None:
        if not replicas:
            raise ValueError("Generation needs at least one replica")
        self.replicas, self.transfer = list(replicas), transfer
        self.policy_version = 0  # of the weights the engines hold (or will, once the queued loads run)
        self.loads: list = []  # load futures queued by sync_weights(wait=False), not yet waited for
        self.replicas_lost = 0

    def live_replicas(self) -> list[Replica]:
        return [replica for replica in self.replicas if not replica.is_stopped]

    def generate(self, prompts: Batch, params: SamplingParams) -> Batch:
        """``B`` prompts → ``B·n`` rows (a prompt's ``n`` responses consecutive) from the live replicas."""
        return self.submit(prompts, params).result()

    def submit(self, prompts: Batch, params: SamplingParams) -> "PendingGeneration":
        """Start generating ``prompts`` and return at once; ``.result()`` waits for the rows. A replica runs its calls
        in order, so a batch submitted after a :meth:`sync_weights` is generated with those weights (the rows'
        ``policy_version`` is the sync's) and one submitted before it with the older ones."""
        live = self._require_live("generate")
        sizes = [size for size in even_sizes(len(prompts), len(live)) if size]
        chunks = prompts.split(sizes) if len(sizes) > 1 else [prompts]
        seeded = [chunk_params(params, index) for index in range(len(chunks))]
        futures = {index: (live[index].generate(chunk, seeded[index], self.policy_version), self.policy_version)
                   for index, chunk in enumerate(chunks)}
        return PendingGeneration(self, chunks, seeded, futures)

    def _replica_lost(self, error: WorkerDiedError, resubmitting: bool) -> Replica:
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

    def _require_live(self, method: str) -> list[Replica]:
        live = self.live_replicas()
        if not live:
            raise RuntimeError(f"{method}: every rollout replica has died ({len(self.replicas)} lost)")
        return live

    def sync_weights(self, policy_version: Optional[int] = None, wait: bool = True) -> dict[str, float]:
        """Bring the replicas to the actor's current weights, as those of the trainer's ``policy_version`` (what
        later rows record; default: one more than the last); the sync's metrics.

        ``wait=False`` (asynchronous training, replicas in processes of their own): the loads are queued behind the
        generations the replicas are running and this returns after publishing; the metrics are those of the
        previous loads. The next sync (or :meth:`finish_loads`) waits for them first: the published arena is
        rewritten only once read. ``weight_sync/publish_seconds`` (where weights are published): this sync's
        publish, as the controller waited for it (the trainer ranks' copy and fingerprints, and the call)."""
        policy_version = self.policy_version + 1 if policy_version is None else policy_version
        previous = self.finish_loads()
        live = [index for index, replica in enumerate(self.replicas) if not replica.is_stopped]
        publication = self.transfer.publish(live, policy_version)
        self.loads = [replica.update_weights(publication, policy_version)
                      for replica in self._require_live("update_weights")]
        self.policy_version = policy_version
        metrics = self.finish_loads() if wait else previous
        if self.transfer.publish_seconds is not None:
            metrics["weight_sync/publish_seconds"] = self.transfer.publish_seconds
        return metrics

    def advance(self, policy_version: int) -> None:
        """The trainer moved on to ``policy_version`` without changing the actor's weights (``trainer.critic_warmup``):
        the engines' weights are relabelled, nothing is moved. Replicas take it in order, behind the generations they
        are running (a partial rollout's tokens in flight keep the older label: staleness is then over-counted, never
        under)."""
        if policy_version == self.policy_version:
            return
        for replica in self._require_live("relabel_weights"):
            pending = replica.relabel_weights(policy_version)
            if pending is not None:
                self.loads.append(pending)
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
                replica = self.generation._replica_lost(error, resubmitting=True)
                version = self.generation.policy_version
                self.futures[index] = (replica.generate(self.chunks[index], self.params[index], version), version)
                continue
            rows[Fields.POLICY_VERSION] = row_policy_versions(rows, policy_version)
            outputs[index] = rows
        self._rows = Batch.concat([outputs[index] for index in range(len(self.chunks))])
        return self._rows
